//! Amazon SQS sink: `SendMessageBatch`, several requests in flight, one
//! outcome per entry.
//!
//! A claimed batch is checked row by row first: a row SQS can never accept
//! (larger than the queue's `MaximumMessageSize`, characters SQS refuses, a
//! FIFO group id SQS would refuse) is rejected here, so it cannot make SQS
//! refuse a whole request and take its batch-mates down with it. The rest
//! is packed, in claim order, into requests of at most 10 entries and at
//! most the request byte limit, and up to [`IN_FLIGHT`] requests run at
//! once. Each entry's result decides its own row: success is `Published`,
//! a sender fault on the entry is `Reject`, anything else is `Retry`.
//!
//! On a FIFO queue, requests that share a message group (an aggregate) are
//! sent one after the other in claim order, never side by side, so SQS
//! sees each group's events in the order the relay claimed them; once an
//! event of a group is to be retried, the group's later events in the same
//! batch are held back instead of overtaking it.
//!
//! [`Sink::ready`] reads the queue's attributes with `GetQueueAttributes`
//! (which also gives `MaximumMessageSize`). The relay asks before every
//! claim, so an answer from SQS (a probe or an accepted request) stands for
//! a few seconds; a transport failure during a publish drops it at once, so
//! an outage stops the relay before it burns more attempts. The attributes
//! are read again at least once a minute even while sends succeed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Region};
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use futures::future::BoxFuture;
use futures::StreamExt;
use tracing::{debug, info, warn};

use super::{Outcome, Sink, SinkError};
use crate::config::{var, ConfigError};
use crate::event::Event;

fn truncate_reason(reason: &str) -> String {
    reason.to_owned()
}

/// SQS sink settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsConfig {
    /// Queue URL; a `.fifo` suffix means a FIFO queue.
    pub queue_url: String,
    /// Endpoint override for emulators.
    pub endpoint_url: Option<String>,
}

impl SqsConfig {
    /// Whether the queue is FIFO (by the AWS naming rule).
    pub fn is_fifo(&self) -> bool {
        self.queue_url.ends_with(".fifo")
    }

    /// Validates the SQS settings.
    pub fn from_settings(queue_url: Option<&str>, endpoint_url: Option<&str>) -> Result<Self, ConfigError> {
        let queue_url = queue_url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| ConfigError::new(var::SQS_QUEUE_URL, "is required when OUTBOX_SINK=sqs"))?;
        validate_http_url(queue_url).map_err(|e| ConfigError::new(var::SQS_QUEUE_URL, e))?;
        let endpoint_url = match endpoint_url.map(str::trim) {
            Some("") | None => None,
            Some(endpoint) => {
                validate_http_url(endpoint).map_err(|e| ConfigError::new(var::SQS_ENDPOINT_URL, e))?;
                Some(endpoint.to_owned())
            }
        };
        Ok(SqsConfig {
            queue_url: queue_url.to_owned(),
            endpoint_url,
        })
    }
}

fn validate_http_url(raw: &str) -> Result<(), String> {
    let url = url::Url::parse(raw).map_err(|e| format!("is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme '{}' is not http or https", url.scheme()));
    }
    if url.password().is_some() {
        return Err("must not carry credentials; use the AWS credential chain".to_owned());
    }
    Ok(())
}

/// SQS takes at most 10 entries per `SendMessageBatch`.
const MAX_ENTRIES: usize = 10;

/// The request size limit every SQS implementation honours: both the
/// largest message and the largest batch request were 256 KiB until AWS
/// raised both to 1 MiB. A queue that reports a larger
/// `MaximumMessageSize` lives on a service with the larger batch limit.
const CLASSIC_REQUEST_BYTES: usize = 256 * 1024;

/// The largest batch request SQS accepts today (sum of the messages' sizes).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Requests in flight at once for one claimed batch. SQS scales with
/// concurrent requests; eight covers a 100-row batch (ten requests) in
/// about one round trip without opening a connection per request.
pub const IN_FLIGHT: usize = 8;

/// How long an answer from SQS (a probe, or a request it processed)
/// stands for [`Sink::ready`]. The relay asks before every claim; probing
/// each time would add a round trip per batch. A transport failure
/// invalidates it early.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// How often `MaximumMessageSize` is read again, so a changed queue setting
/// is noticed while the relay is busy.
const REREAD_ATTRIBUTES_AFTER: Duration = Duration::from_secs(60);

/// Region used when none is configured anywhere and the queue URL does not
/// name one (an emulator URL): emulators accept any region, but SigV4
/// needs one.
const FALLBACK_REGION: &str = "us-east-1";

/// The data type of every message attribute the relay sets.
const STRING: &str = "String";

/// Publishes to one SQS queue (standard or FIFO).
pub struct SqsSink {
    client: Client,
    queue_url: String,
    fifo: bool,
    state: Mutex<QueueState>,
}

/// What the last look at the queue found.
#[derive(Debug, Default)]
struct QueueState {
    /// The queue's `MaximumMessageSize` in bytes, and when it was read.
    max_message_size: Option<(usize, Instant)>,
    /// When SQS last answered; `None` after a transport failure, so the
    /// next [`Sink::ready`] asks again.
    answered_at: Option<Instant>,
}

impl SqsSink {
    /// Builds the client from the standard AWS configuration chain
    /// (environment, profile, web identity for IRSA, container and instance
    /// metadata). Nothing is sent here: credentials are resolved and the
    /// queue is reached on first use, in [`Sink::ready`].
    ///
    /// Region: a queue URL on AWS names its region
    /// (`https://sqs.eu-west-1.amazonaws.com/…`), and requests must go
    /// there, so that region wins. Otherwise (an emulator URL) the standard
    /// chain decides (`AWS_REGION`, profile, instance metadata), and
    /// `us-east-1` if it finds none.
    pub async fn new(config: &SqsConfig) -> Result<Self, SinkError> {
        let url_region = region_from_queue_url(&config.queue_url);
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &url_region {
            for variable in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
                if let Ok(configured) = std::env::var(variable) {
                    if !configured.is_empty() && configured != *region {
                        warn!(
                            %variable,
                            configured = %configured,
                            queue_region = %region,
                            "the queue URL names another region; using the queue's region"
                        );
                    }
                }
            }
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &config.endpoint_url {
            loader = loader.endpoint_url(endpoint);
        }
        let shared = loader.load().await;
        let mut builder = aws_sdk_sqs::config::Builder::from(&shared)
            // A transient failure (a stale pooled connection, a 5xx, a
            // throttle) gets two quick SDK retries inside the publish
            // timeout; what still fails is the relay's failed attempt.
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(3)
                    .with_initial_backoff(Duration::from_millis(100))
                    .with_max_backoff(Duration::from_secs(2)),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .operation_attempt_timeout(Duration::from_secs(10))
                    .build(),
            );
        if shared.region().is_none() {
            info!(
                region = FALLBACK_REGION,
                "no AWS region configured and none in the queue URL; using the fallback"
            );
            builder = builder.region(Region::new(FALLBACK_REGION));
        }
        Ok(Self {
            client: Client::from_conf(builder.build()),
            queue_url: config.queue_url.clone(),
            fifo: config.is_fifo(),
            state: Mutex::new(QueueState::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The lock is only held for plain field updates, which cannot
        // panic, so a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets that SQS answered: the next `ready()` asks it.
    fn suspect(&self) {
        self.state().answered_at = None;
    }

    /// Records that SQS processed a request.
    fn answered(&self) {
        self.state().answered_at = Some(Instant::now());
    }

    /// `GetQueueAttributes`, refreshing the cached `MaximumMessageSize`.
    async fn probe(&self) -> Result<usize, SinkError> {
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .customize()
            // Readiness must answer within the health probe's time, so no
            // long SDK retries here; the relay retries with its own backoff.
            .config_override(
                aws_sdk_sqs::config::Builder::default()
                    .retry_config(
                        RetryConfig::standard()
                            .with_max_attempts(2)
                            .with_initial_backoff(Duration::from_millis(50)),
                    )
                    .timeout_config(
                        TimeoutConfig::builder()
                            .connect_timeout(Duration::from_secs(1))
                            .operation_timeout(Duration::from_millis(2500))
                            .build(),
                    ),
            )
            .send()
            .await
            .map_err(|e| {
                SinkError(truncate_reason(&format!(
                    "GetQueueAttributes on {} failed: {}",
                    self.queue_url,
                    describe_sdk_error(&e)
                )))
            })?;
        let reported = answer
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::MaximumMessageSize))
            .and_then(|value| value.trim().parse::<usize>().ok());
        let max_message_size = match reported {
            Some(size) => size,
            None => {
                // Some emulators leave it out; the classic limit is the
                // smallest any SQS has had, so nothing it lets through is
                // refused for size.
                warn!(
                    assumed = CLASSIC_REQUEST_BYTES,
                    "the queue did not report MaximumMessageSize; assuming the classic limit"
                );
                CLASSIC_REQUEST_BYTES
            }
        };
        let first = {
            let mut state = self.state();
            let now = Instant::now();
            let first = state.max_message_size.is_none();
            state.max_message_size = Some((max_message_size, now));
            state.answered_at = Some(now);
            first
        };
        if first {
            info!(queue = %self.queue_url, fifo = self.fifo, max_message_size, "SQS queue reachable");
        } else {
            debug!(queue = %self.queue_url, max_message_size, "SQS queue checked");
        }
        Ok(max_message_size)
    }

    async fn check(&self) -> Result<(), SinkError> {
        let fresh = {
            let state = self.state();
            state.answered_at.is_some_and(|at| at.elapsed() < RECHECK_AFTER)
                && state
                    .max_message_size
                    .is_some_and(|(_, read_at)| read_at.elapsed() < REREAD_ATTRIBUTES_AFTER)
        };
        if fresh {
            return Ok(());
        }
        self.probe().await.map(|_| ())
    }

    /// The queue's `MaximumMessageSize`, probing if it was never read.
    async fn max_message_size(&self) -> Result<usize, SinkError> {
        let known = self.state().max_message_size;
        match known {
            Some((size, _)) => Ok(size),
            None => self.probe().await,
        }
    }

    async fn publish_batch(&self, events: &[Event]) -> Vec<Outcome> {
        let max_message_size = match self.max_message_size().await {
            Ok(size) => size,
            Err(e) => return vec![Outcome::Retry(e.0); events.len()],
        };
        let mut outcomes: Vec<Option<Outcome>> = vec![None; events.len()];
        let mut sendable = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match precheck(event, self.fifo, max_message_size) {
                Ok(size) => sendable.push((index, size)),
                Err(reason) => outcomes[index] = Some(Outcome::Reject(reason)),
            }
        }
        let requests = group_requests(&sendable, MAX_ENTRIES, request_byte_limit(max_message_size));
        let chains = if self.fifo {
            chain_by_group(requests, |index| events[index].aggregate_id.as_str())
        } else {
            requests.into_iter().map(|request| vec![request]).collect()
        };
        let group_of = |index: usize| self.fifo.then(|| events[index].aggregate_id.as_str());
        let results: Vec<Vec<(usize, Outcome)>> = futures::stream::iter(chains)
            .map(|chain| run_chain(chain, group_of, |request| self.send_request(events, request)))
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for (index, outcome) in results.into_iter().flatten() {
            outcomes[index] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Outcome::Retry("not attempted".to_owned())))
            .collect()
    }

    /// Sends one `SendMessageBatch` for `request` (indexes into `events`).
    /// Entry ids are positions in the request, which SQS allows (1–80
    /// characters of `[A-Za-z0-9_-]`) and which map straight back.
    async fn send_request(&self, events: &[Event], request: Vec<usize>) -> Sent {
        let mut entries = Vec::with_capacity(request.len());
        for (position, &index) in request.iter().enumerate() {
            match entry(position, &events[index], self.fifo) {
                Ok(built) => entries.push(built),
                // Only a missing required field fails a build, and `entry`
                // sets both; should that ever change, it is our bug, not
                // the rows': retry rather than quarantine.
                Err(e) => {
                    return Sent::Outcomes(vec![
                        Outcome::Retry(format!("cannot build entry: {e}"));
                        request.len()
                    ])
                }
            }
        }
        let response = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        match response {
            Ok(output) => {
                self.answered();
                let successful: Vec<&str> = output.successful().iter().map(|ok| ok.id()).collect();
                Sent::Outcomes(entry_outcomes(request.len(), &successful, output.failed()))
            }
            Err(e) => {
                let status = e.raw_response().map(|raw| raw.status().as_u16());
                let reason = truncate_reason(&format!("SendMessageBatch failed: {}", describe_sdk_error(&e)));
                match classify_request_error(e.code(), status) {
                    RequestVerdict::Split => {
                        self.answered();
                        debug!(entries = request.len(), %reason, "request refused as a whole; sending it in halves");
                        Sent::Split(reason)
                    }
                    RequestVerdict::Retry { outage } => {
                        if outage {
                            self.suspect();
                        } else {
                            self.answered();
                        }
                        Sent::Outcomes(vec![Outcome::Retry(reason); request.len()])
                    }
                }
            }
        }
    }
}

impl Sink for SqsSink {
    fn publish<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events))
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(self.check())
    }

    fn kind(&self) -> &'static str {
        "sqs"
    }
}

/// The region named by an AWS SQS queue URL: `sqs.<region>.amazonaws.com`
/// (also `sqs-fips.`, VPC endpoint names and `.amazonaws.com.cn`), or the
/// legacy `<region>.queue.amazonaws.com` and `queue.amazonaws.com`.
fn region_from_queue_url(queue_url: &str) -> Option<String> {
    let url = url::Url::parse(queue_url).ok()?;
    let host = url.host_str()?.to_ascii_lowercase();
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"))?;
    let labels: Vec<&str> = rest.split('.').collect();
    let region = match labels.as_slice() {
        ["queue"] => "us-east-1",
        [region, "queue"] => region,
        _ => {
            let at = labels
                .iter()
                .position(|label| matches!(*label, "sqs" | "sqs-fips"))?;
            labels.get(at + 1)?
        }
    };
    let plausible = !region.is_empty()
        && region.contains('-')
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    plausible.then(|| region.to_owned())
}

/// An SDK error in one line with its causes: the code and message for a
/// service error, the cause chain (connection refused, timeout, missing
/// credentials) otherwise. SDK errors never include credentials.
fn describe_sdk_error<E, R>(error: &SdkError<E, R>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => DisplayErrorContext(error).to_string(),
    }
}

/// The message attributes of an event, in a fixed order.
fn attributes(event: &Event) -> Vec<(&'static str, String)> {
    let mut attributes = vec![
        ("event_id", event.id.to_string()),
        ("event_type", event.event_type.clone()),
        ("aggregate_id", event.aggregate_id.clone()),
    ];
    if let Some(causation_id) = event.causation_id {
        attributes.push(("causation_id", causation_id.to_string()));
    }
    attributes
}

/// The size SQS counts for a message: the body plus, for each attribute,
/// its name, data type and value.
fn message_size(body: &str, attributes: &[(&'static str, String)]) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(name, value)| name.len() + STRING.len() + value.len())
            .sum::<usize>()
}

/// The first character SQS does not accept in a message body or string
/// attribute (only #x9 #xA #xD #x20–#xD7FF #xE000–#xFFFD #x10000–#x10FFFF
/// are allowed), with its byte offset.
fn first_invalid_char(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|&(_, c)| {
        !matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
    })
}

/// What SQS accepts as a FIFO `MessageGroupId`: 1 to 128 characters, each
/// alphanumeric or ASCII punctuation.
fn valid_group_id(group: &str) -> bool {
    (1..=128).contains(&group.len()) && group.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks what can be known to fail before sending and would fail on every
/// attempt; returns the message size on success, the reason otherwise.
fn precheck(event: &Event, fifo: bool, max_message_size: usize) -> Result<usize, String> {
    if event.payload.is_empty() {
        return Err("payload is empty; SQS needs a message body of at least one character".to_owned());
    }
    if let Some((at, c)) = first_invalid_char(&event.payload) {
        return Err(format!(
            "payload contains the character U+{:04X} at byte {at}, which SQS does not allow in a message body",
            u32::from(c)
        ));
    }
    let attributes = attributes(event);
    for (name, value) in &attributes {
        if value.is_empty() {
            return Err(format!(
                "{name} is empty; SQS does not allow empty attribute values"
            ));
        }
        if let Some((at, c)) = first_invalid_char(value) {
            return Err(format!(
                "{name} contains the character U+{:04X} at byte {at}, which SQS does not allow in an attribute",
                u32::from(c)
            ));
        }
    }
    if fifo && !valid_group_id(&event.aggregate_id) {
        return Err(
            "aggregate_id cannot be a FIFO MessageGroupId (1 to 128 ASCII letters, digits or punctuation)"
                .to_owned(),
        );
    }
    let size = message_size(&event.payload, &attributes);
    if size > max_message_size {
        return Err(format!(
            "message of {size} bytes (body and attributes) exceeds the queue's MaximumMessageSize of {max_message_size} bytes"
        ));
    }
    Ok(size)
}

/// The byte budget of one `SendMessageBatch` for a queue whose messages may
/// be up to `max_message_size` bytes (see [`CLASSIC_REQUEST_BYTES`]).
fn request_byte_limit(max_message_size: usize) -> usize {
    max_message_size.clamp(CLASSIC_REQUEST_BYTES, MAX_REQUEST_BYTES)
}

/// Packs `(index, size)` items, in order, into requests of at most
/// `max_entries` items and `max_bytes` total size. An item larger than
/// `max_bytes` on its own (prevented by the precheck) goes alone.
fn group_requests(items: &[(usize, usize)], max_entries: usize, max_bytes: usize) -> Vec<Vec<usize>> {
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
fn chain_by_group<'e>(
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sent {
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
async fn run_chain<'e, G, S, F>(chain: Vec<Vec<usize>>, group_of: G, mut send: S) -> Vec<(usize, Outcome)>
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
                Outcome::Retry(
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
                    if let (Outcome::Retry(_), Some(group)) = (&outcome, group_of(index)) {
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

/// The SQS entry for `event` at `position` in its request.
fn entry(
    position: usize,
    event: &Event,
    fifo: bool,
) -> Result<SendMessageBatchRequestEntry, aws_sdk_sqs::error::BuildError> {
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(position.to_string())
        .message_body(event.payload.clone());
    for (name, value) in attributes(event) {
        builder = builder.message_attributes(
            name,
            MessageAttributeValue::builder()
                .data_type(STRING)
                .string_value(value)
                .build()?,
        );
    }
    if fifo {
        builder = builder
            .message_group_id(event.aggregate_id.clone())
            .message_deduplication_id(event.id.to_string());
    }
    builder.build()
}

/// Maps a `SendMessageBatch` answer back to its `count` entries (ids are
/// positions). An entry SQS reports as failed, or does not mention at all,
/// is never `Published`.
fn entry_outcomes(count: usize, successful: &[&str], failed: &[BatchResultErrorEntry]) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; count];
    for failure in failed {
        let Some(slot) = failure
            .id()
            .parse::<usize>()
            .ok()
            .and_then(|at| outcomes.get_mut(at))
        else {
            continue;
        };
        let reason = truncate_reason(&format!(
            "SQS refused the message: {}: {}",
            failure.code(),
            failure.message().unwrap_or("no message")
        ));
        *slot = Some(
            match classify_entry_error(failure.code(), failure.sender_fault()) {
                Verdict::Retry => Outcome::Retry(reason),
                Verdict::Reject => Outcome::Reject(reason),
            },
        );
    }
    for id in successful {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|at| outcomes.get_mut(at)) {
            slot.get_or_insert(Outcome::Published);
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| Outcome::Retry("SQS returned no result for this entry".to_owned()))
        })
        .collect()
}

/// Whether a failure can pass by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Retry,
    Reject,
}

/// Error codes that are about the moment or the setup (throttling, KMS,
/// permissions, the queue), never about the message, whatever the
/// SenderFault flag says: retrying them is right, quarantining every row
/// because of a missing IAM permission is not.
fn is_transient_code(code: &str) -> bool {
    let code = code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code);
    let lower = code.to_ascii_lowercase();
    lower.contains("throttl")
        || lower.starts_with("kms")
        || lower.contains("accessdenied")
        || lower.contains("unavailable")
        || matches!(
            code,
            "InternalError"
                | "InternalFailure"
                | "RequestExpired"
                | "InvalidSecurity"
                | "InvalidClientTokenId"
                | "UnrecognizedClientException"
                | "SignatureDoesNotMatch"
                | "ExpiredToken"
                | "MissingAuthenticationToken"
                | "QueueDoesNotExist"
                | "NonExistentQueue"
                | "RequestCanceled"
                | "OverLimit"
        )
}

/// A failed entry: the sender's fault means this message is wrong and will
/// stay wrong (too large, invalid characters or attribute); otherwise SQS
/// had a problem and a later attempt can succeed.
fn classify_entry_error(code: &str, sender_fault: bool) -> Verdict {
    if is_transient_code(code) || !sender_fault {
        Verdict::Retry
    } else {
        Verdict::Reject
    }
}

/// What to do about a `SendMessageBatch` that failed as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestVerdict {
    /// Every entry is retried; `outage` when the queue may be unreachable,
    /// so readiness is checked again before the next claim.
    Retry { outage: bool },
    /// A content error one entry can cause: split to find it.
    Split,
}

/// Classifies a whole-request failure by its error code (if SQS answered)
/// and HTTP status (if any response arrived).
fn classify_request_error(code: Option<&str>, status: Option<u16>) -> RequestVerdict {
    const CONTENT_CODES: [&str; 8] = [
        "InvalidParameterValue",
        "InvalidMessageContents",
        "MessageTooLong",
        "BatchRequestTooLong",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "MessageAttributesInvalid",
        "MissingParameter",
    ];
    match code {
        Some(code) if is_transient_code(code) => RequestVerdict::Retry {
            outage: status.is_some_and(|s| s >= 500),
        },
        Some(code)
            if CONTENT_CODES.contains(&code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code)) =>
        {
            RequestVerdict::Split
        }
        // Another client error (a malformed queue URL, an unsupported
        // operation): nothing to do with one row, so every row waits.
        Some(_) => RequestVerdict::Retry {
            outage: status.is_some_and(|s| s >= 500),
        },
        // No service answer at all: connection refused or reset, timeout.
        None => RequestVerdict::Retry { outage: true },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(aggregate_id: &str, payload: &str) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: aggregate_id.into(),
            payload: payload.into(),
            created_at: Utc::now(),
            attempt_count: 1,
        }
    }

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

    #[test]
    fn attributes_carry_the_ids_and_causation_only_when_set() {
        let mut e = event("agg-1", "{}");
        let names: Vec<&str> = attributes(&e).iter().map(|(name, _)| *name).collect();
        assert_eq!(names, vec!["event_id", "event_type", "aggregate_id"]);
        let cause = Uuid::new_v4();
        e.causation_id = Some(cause);
        let built = attributes(&e);
        assert_eq!(built[0], ("event_id", e.id.to_string()));
        assert_eq!(built[1], ("event_type", "order.created".to_owned()));
        assert_eq!(built[2], ("aggregate_id", "agg-1".to_owned()));
        assert_eq!(built[3], ("causation_id", cause.to_string()));
        // body 2 + event_id (8+6+36) + event_type (10+6+13) + aggregate_id (12+6+5) + causation (12+6+36)
        assert_eq!(message_size(&e.payload, &built), 2 + 50 + 29 + 23 + 54);
    }

    #[test]
    fn entries_carry_fifo_fields_only_on_fifo_queues() {
        let e = event("agg-1", r#"{"a":1}"#);
        let standard = entry(3, &e, false).unwrap();
        assert_eq!(standard.id(), "3");
        assert_eq!(standard.message_body(), r#"{"a":1}"#);
        assert!(standard.message_group_id().is_none());
        assert!(standard.message_deduplication_id().is_none());
        let attrs = standard.message_attributes().unwrap();
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs["event_id"].string_value(), Some(e.id.to_string().as_str()));
        assert_eq!(attrs["event_id"].data_type(), "String");
        let fifo = entry(0, &e, true).unwrap();
        assert_eq!(fifo.message_group_id(), Some("agg-1"));
        assert_eq!(fifo.message_deduplication_id(), Some(e.id.to_string().as_str()));
    }

    #[test]
    fn characters_outside_the_sqs_set_are_found() {
        assert_eq!(first_invalid_char("{\"a\":\"tab\there\nok\r\"}"), None);
        assert_eq!(
            first_invalid_char("ünïcødé ✓ 🎉 \u{D7FF}\u{E000}\u{FFFD}\u{10FFFF}"),
            None
        );
        assert_eq!(first_invalid_char("ab\u{0}"), Some((2, '\u{0}')));
        assert_eq!(first_invalid_char("\u{1F}"), Some((0, '\u{1F}')));
        assert_eq!(first_invalid_char("x\u{FFFE}"), Some((1, '\u{FFFE}')));
        assert_eq!(first_invalid_char("é\u{FFFF}"), Some((2, '\u{FFFF}')));
        assert_eq!(first_invalid_char("\u{B}"), Some((0, '\u{B}')));
    }

    #[test]
    fn prechecks_reject_what_sqs_never_accepts() {
        assert!(precheck(&event("a", "{}"), false, 1024).is_ok());
        let big = format!("\"{}\"", "x".repeat(2000));
        let reason = precheck(&event("a", &big), false, 1024).unwrap_err();
        assert!(reason.contains("MaximumMessageSize of 1024"), "{reason}");
        let bad = precheck(&event("a", "\"\u{FFFF}\""), false, 1024).unwrap_err();
        assert!(bad.contains("U+FFFF"), "{bad}");
        assert!(precheck(&event("", "{}"), false, 1024)
            .unwrap_err()
            .contains("aggregate_id is empty"));
        // Fine on a standard queue, not as a FIFO group id.
        assert!(precheck(&event("order 7", "{}"), false, 1024).is_ok());
        assert!(precheck(&event("order 7", "{}"), true, 1024).is_err());
        assert!(precheck(&event(&"a".repeat(129), "{}"), true, 1024).is_err());
        assert!(precheck(&event("order-7/é", "{}"), true, 1024).is_err());
        assert!(precheck(&event("order-7:{x}", "{}"), true, 1024).is_ok());
        // Attributes count towards the size: a body that fits alone does not.
        let e = event("a", &"1".repeat(1000));
        assert!(precheck(&e, false, 1024).is_err());
        assert!(precheck(&e, false, 1100).is_ok());
    }

    #[test]
    fn entry_errors_are_classified_by_sender_fault_and_code() {
        assert_eq!(
            classify_entry_error("InvalidParameterValue", true),
            Verdict::Reject
        );
        assert_eq!(
            classify_entry_error("InvalidMessageContents", true),
            Verdict::Reject
        );
        assert_eq!(classify_entry_error("MessageTooLong", true), Verdict::Reject);
        assert_eq!(classify_entry_error("InternalError", false), Verdict::Retry);
        assert_eq!(classify_entry_error("ServiceUnavailable", false), Verdict::Retry);
        assert_eq!(classify_entry_error("SomethingNew", false), Verdict::Retry);
        assert_eq!(classify_entry_error("SomethingNew", true), Verdict::Reject);
        // Sender faults that are about the moment or the setup, not the message.
        assert_eq!(classify_entry_error("RequestThrottled", true), Verdict::Retry);
        assert_eq!(classify_entry_error("ThrottlingException", true), Verdict::Retry);
        assert_eq!(
            classify_entry_error("KMS.ThrottlingException", true),
            Verdict::Retry
        );
        assert_eq!(classify_entry_error("KmsAccessDenied", true), Verdict::Retry);
        assert_eq!(classify_entry_error("AccessDenied", true), Verdict::Retry);
        assert_eq!(
            classify_entry_error("AWS.SimpleQueueService.NonExistentQueue", true),
            Verdict::Retry
        );
    }

    #[test]
    fn request_errors_split_only_for_content_problems() {
        assert_eq!(
            classify_request_error(Some("InvalidParameterValue"), Some(400)),
            RequestVerdict::Split
        );
        assert_eq!(
            classify_request_error(Some("BatchRequestTooLong"), Some(400)),
            RequestVerdict::Split
        );
        assert_eq!(
            classify_request_error(Some("RequestThrottled"), Some(400)),
            RequestVerdict::Retry { outage: false }
        );
        assert_eq!(
            classify_request_error(Some("InternalError"), Some(500)),
            RequestVerdict::Retry { outage: true }
        );
        assert_eq!(
            classify_request_error(Some("AWS.SimpleQueueService.NonExistentQueue"), Some(400)),
            RequestVerdict::Retry { outage: false }
        );
        assert_eq!(
            classify_request_error(Some("AccessDenied"), Some(403)),
            RequestVerdict::Retry { outage: false }
        );
        assert_eq!(
            classify_request_error(None, None),
            RequestVerdict::Retry { outage: true }
        );
        assert_eq!(
            classify_request_error(None, Some(502)),
            RequestVerdict::Retry { outage: true }
        );
    }

    fn failure(id: &str, sender_fault: bool, code: &str) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder()
            .id(id)
            .sender_fault(sender_fault)
            .code(code)
            .message("m")
            .build()
            .unwrap()
    }

    #[test]
    fn each_entry_result_maps_to_its_own_row() {
        let failed = [
            failure("1", true, "InvalidParameterValue"),
            failure("3", false, "InternalError"),
        ];
        let outcomes = entry_outcomes(5, &["0", "2", "99", "x"], &failed);
        assert_eq!(outcomes[0], Outcome::Published);
        assert!(matches!(&outcomes[1], Outcome::Reject(r) if r.contains("InvalidParameterValue")));
        assert_eq!(outcomes[2], Outcome::Published);
        assert!(matches!(&outcomes[3], Outcome::Retry(r) if r.contains("InternalError")));
        assert!(matches!(&outcomes[4], Outcome::Retry(r) if r.contains("no result")));
        // Listed as both: not published.
        let outcomes = entry_outcomes(1, &["0"], &[failure("0", false, "InternalError")]);
        assert!(matches!(outcomes[0], Outcome::Retry(_)));
    }

    #[test]
    fn queue_urls_name_their_region() {
        let region = |url: &str| region_from_queue_url(url);
        assert_eq!(
            region("https://sqs.eu-west-1.amazonaws.com/123456789012/q").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            region("https://sqs-fips.us-gov-west-1.amazonaws.com/1/q.fifo").as_deref(),
            Some("us-gov-west-1")
        );
        assert_eq!(
            region("https://sqs.cn-north-1.amazonaws.com.cn/1/q").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(
            region("https://us-west-2.queue.amazonaws.com/1/q").as_deref(),
            Some("us-west-2")
        );
        assert_eq!(
            region("https://queue.amazonaws.com/1/q").as_deref(),
            Some("us-east-1")
        );
        assert_eq!(
            region("https://vpce-0a1b.sqs.ap-south-1.vpce.amazonaws.com/1/q").as_deref(),
            Some("ap-south-1")
        );
        assert_eq!(region("http://127.0.0.1:4566/000000000000/q"), None);
        assert_eq!(region("http://localhost:9324/queue/q"), None);
        assert_eq!(region("https://example.amazonaws.com/q"), None);
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
        assert!(matches!(outcome(2), Some(Outcome::Retry(r)) if r.contains("held back")));
        assert!(matches!(outcome(5), Some(Outcome::Retry(r)) if r.contains("held back")));
        assert_eq!(outcome(1), Some(Outcome::Published));
        assert_eq!(outcome(4), Some(Outcome::Published));
        // Standard queues have no groups: nothing is held back.
        let (_, sent) = run_scripted(vec![vec![0, 1], vec![2, 3]], &GROUPS, false, |request| {
            Sent::Outcomes(vec![Outcome::Retry("x".into()); request.len()])
        });
        assert_eq!(sent, vec![vec![0, 1], vec![2, 3]]);
    }
}
