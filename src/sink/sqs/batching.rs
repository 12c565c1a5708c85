//! Packing a claimed batch into `SendMessageBatch` requests, and running
//! them so that no FIFO message group is reordered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;

use super::Outcome;

/// SQS takes at most 10 entries per `SendMessageBatch`.
pub(super) const MAX_ENTRIES: usize = 10;

/// The request size limit every SQS implementation honours: both the
/// largest message and the largest batch request were 256 KiB until AWS
/// raised both to 1 MiB. A queue that reports a larger
/// `MaximumMessageSize` lives on a service with the larger batch limit.
pub(super) const CLASSIC_REQUEST_BYTES: usize = 256 * 1024;

/// The largest batch request SQS accepts today (sum of the messages' sizes).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// The byte budget of one `SendMessageBatch` for a queue whose messages may
/// be up to `max_message_size` bytes (see [`CLASSIC_REQUEST_BYTES`]).
pub(super) fn request_byte_limit(max_message_size: usize) -> usize {
    max_message_size.clamp(CLASSIC_REQUEST_BYTES, MAX_REQUEST_BYTES)
}

/// Packs `(index, size)` items, in order, into requests of at most
/// `max_entries` items and `max_bytes` total size. An item larger than
/// `max_bytes` on its own (prevented by the precheck) goes alone.
pub(super) fn group_requests(
    items: &[(usize, usize)],
    max_entries: usize,
    max_bytes: usize,
) -> Vec<Vec<usize>> {
    let mut requests = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for &(index, size) in items {
        if !current.is_empty() && (current.len() == max_entries || bytes + size > max_bytes) {
            requests.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(index);
        bytes += size;
    }
    if !current.is_empty() {
        requests.push(current);
    }
    requests
}

/// Joins requests that share a message group into chains, each keeping its
/// requests in their original order; chains share no group, so they can
/// run side by side without reordering any group.
pub(super) fn chain_by_group<'e>(
    requests: Vec<Vec<usize>>,
    group_of: impl Fn(usize) -> &'e str,
) -> Vec<Vec<Vec<usize>>> {
    // Union-find over request positions, joined through the last request
    // seen for each group.
    let mut parent: Vec<usize> = (0..requests.len()).collect();
    fn root(parent: &mut [usize], mut at: usize) -> usize {
        while parent[at] != at {
            parent[at] = parent[parent[at]];
            at = parent[at];
        }
        at
    }
    let mut last_request_of: HashMap<&'e str, usize> = HashMap::new();
    for (position, request) in requests.iter().enumerate() {
        for &index in request {
            if let Some(earlier) = last_request_of.insert(group_of(index), position) {
                let (a, b) = (root(&mut parent, earlier), root(&mut parent, position));
                // The smaller root stays the root, so a chain is ordered by
                // its first request.
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut chain_of_root: HashMap<usize, usize> = HashMap::new();
    let mut chains: Vec<Vec<Vec<usize>>> = Vec::new();
    for (position, request) in requests.into_iter().enumerate() {
        let at = root(&mut parent, position);
        let chain = *chain_of_root.entry(at).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(request);
    }
    chains
}

/// The result of one `SendMessageBatch`.
///
/// Kept apart from [`Outcome`] because a split is a verdict on a request,
/// not on a row: it names no culprit, only that one of the entries made
/// SQS refuse them all. [`run_chain`] turns it into outcomes, a `Reject`
/// once the request is down to one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Sent {
    /// One outcome per entry, in request order.
    Outcomes(Vec<Outcome>),
    /// Refused as a whole for a reason one entry can cause (too long,
    /// invalid contents): its halves are sent apart to isolate the culprit.
    Split(String),
}

/// Sends a chain's requests one after the other. A request refused as a
/// whole for content is split in halves until the offending entry stands
/// alone and is rejected. With `group_of` (FIFO), once an entry is to be
/// retried, later entries of its group are held back so they cannot
/// overtake it.
pub(super) async fn run_chain<'e, G, S, F>(
    chain: Vec<Vec<usize>>,
    group_of: G,
    mut send: S,
) -> Vec<(usize, Outcome)>
where
    G: Fn(usize) -> Option<&'e str>,
    S: FnMut(Vec<usize>) -> F,
    F: Future<Output = Sent>,
{
    let mut results = Vec::new();
    let mut retrying: HashSet<&'e str> = HashSet::new();
    let mut pending: VecDeque<Vec<usize>> = chain.into();
    while let Some(request) = pending.pop_front() {
        let (held, request): (Vec<usize>, Vec<usize>) = request
            .into_iter()
            .partition(|&index| group_of(index).is_some_and(|group| retrying.contains(group)));
        for index in held {
            results.push((
                index,
                // Not sent, so not an attempt of its own.
                Outcome::Deferred(
                    "held back: an earlier event of its message group is being retried".to_owned(),
                ),
            ));
        }
        if request.is_empty() {
            continue;
        }
        match send(request.clone()).await {
            Sent::Outcomes(outcomes) => {
                for (index, outcome) in request.into_iter().zip(outcomes) {
                    if let (Outcome::Retry(_) | Outcome::Deferred(_), Some(group)) =
                        (&outcome, group_of(index))
                    {
                        retrying.insert(group);
                    }
                    results.push((index, outcome));
                }
            }
            Sent::Split(reason) if request.len() == 1 => {
                results.push((request[0], Outcome::Reject(reason)));
            }
            Sent::Split(_) => {
                let mut first = request;
                let second = first.split_off(first.len() / 2);
                pending.push_front(second);
                pending.push_front(first);
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_hold_at_most_ten_entries() {
        let items: Vec<(usize, usize)> = (0..25).map(|i| (i, 100)).collect();
        let requests = group_requests(&items, MAX_ENTRIES, MAX_REQUEST_BYTES);
        let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 10, 5]);
        let flat: Vec<usize> = requests.into_iter().flatten().collect();
        assert_eq!(flat, (0..25).collect::<Vec<_>>(), "claim order is kept");
    }

    #[test]
    fn requests_stay_within_the_byte_limit() {
        let kib = 1024;
        let items = [
            (0, 100 * kib),
            (1, 100 * kib),
            (2, 100 * kib),
            (3, 256 * kib),
            (4, 1),
            (5, 56 * kib),
        ];
        let requests = group_requests(&items, MAX_ENTRIES, 256 * kib);
        assert_eq!(requests, vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
        assert!(group_requests(&[], MAX_ENTRIES, 256 * kib).is_empty());
    }

    #[test]
    fn request_budget_follows_the_queue_generation() {
        assert_eq!(request_byte_limit(1024), CLASSIC_REQUEST_BYTES);
        assert_eq!(request_byte_limit(262_144), CLASSIC_REQUEST_BYTES);
        assert_eq!(request_byte_limit(1_048_576), MAX_REQUEST_BYTES);
        assert_eq!(request_byte_limit(usize::MAX), MAX_REQUEST_BYTES);
    }

    #[test]
    fn requests_sharing_a_group_form_one_ordered_chain() {
        let groups = ["a", "b", "c", "a", "d", "e"];
        let requests = vec![vec![0, 1], vec![2], vec![3], vec![4, 5]];
        let chains = chain_by_group(requests, |index| groups[index]);
        assert_eq!(
            chains,
            vec![vec![vec![0, 1], vec![3]], vec![vec![2]], vec![vec![4, 5]]]
        );
        // Transitive: a links 0 and 2, b links 2 and 3.
        let groups = ["a", "x", "a", "b", "b"];
        let requests = vec![vec![0], vec![1], vec![2, 3], vec![4]];
        let chains = chain_by_group(requests, |index| groups[index]);
        assert_eq!(chains, vec![vec![vec![0], vec![2, 3], vec![4]], vec![vec![1]]]);
    }

    /// Drives [`run_chain`] with a scripted sender, recording what was sent.
    fn run_scripted(
        chain: Vec<Vec<usize>>,
        groups: &'static [&'static str],
        fifo: bool,
        answer: impl Fn(&[usize]) -> Sent,
    ) -> (Vec<(usize, Outcome)>, Vec<Vec<usize>>) {
        let sent = std::cell::RefCell::new(Vec::new());
        let results = futures::executor::block_on(run_chain(
            chain,
            |index| fifo.then_some(groups[index]),
            |request| {
                let answer = answer(&request);
                sent.borrow_mut().push(request);
                async move { answer }
            },
        ));
        (results, sent.into_inner())
    }

    #[test]
    fn a_request_refused_for_content_is_split_until_the_culprit_stands_alone() {
        let culprit = 5;
        let (results, sent) = run_scripted(vec![(0..8).collect()], &["g"; 8], false, |request| {
            if request.contains(&culprit) {
                Sent::Split("InvalidParameterValue: too long".into())
            } else {
                Sent::Outcomes(vec![Outcome::Published; request.len()])
            }
        });
        assert_eq!(results.len(), 8);
        for (index, outcome) in results {
            if index == culprit {
                assert!(matches!(outcome, Outcome::Reject(r) if r.contains("too long")));
            } else {
                assert_eq!(outcome, Outcome::Published, "row {index}");
            }
        }
        assert_eq!(sent[0], (0..8).collect::<Vec<_>>());
        assert_eq!(sent.len(), 7, "8 → 4+4 → 2+2 → 1+1: {sent:?}");
    }

    #[test]
    fn fifo_groups_behind_a_retry_are_held_back_but_others_go_on() {
        static GROUPS: [&str; 6] = ["a", "b", "a", "c", "b", "a"];
        let (results, sent) = run_scripted(
            vec![vec![0, 1], vec![2, 3], vec![4, 5]],
            &GROUPS,
            true,
            |request| {
                Sent::Outcomes(
                    request
                        .iter()
                        .map(|&index| {
                            if index == 0 {
                                Outcome::Retry("throttled".into())
                            } else {
                                Outcome::Published
                            }
                        })
                        .collect(),
                )
            },
        );
        assert_eq!(sent, vec![vec![0, 1], vec![3], vec![4]]);
        let outcome = |index: usize| results.iter().find(|(i, _)| *i == index).map(|(_, o)| o.clone());
        assert!(matches!(outcome(2), Some(Outcome::Deferred(r)) if r.contains("held back")));
        assert!(matches!(outcome(5), Some(Outcome::Deferred(r)) if r.contains("held back")));
        assert_eq!(outcome(1), Some(Outcome::Published));
        assert_eq!(outcome(4), Some(Outcome::Published));
        // Standard queues have no groups: nothing is held back.
        let (_, sent) = run_scripted(vec![vec![0, 1], vec![2, 3]], &GROUPS, false, |request| {
            Sent::Outcomes(vec![Outcome::Retry("x".into()); request.len()])
        });
        assert_eq!(sent, vec![vec![0, 1], vec![2, 3]]);
    }
}
