//! The relay's `/metrics` as a test reads it: the value of one series in
//! the Prometheus text exposition, and a wait until it shows given values.

use std::time::{Duration, Instant};

use crate::http::http_get;

/// The value of the series of metric `name` whose label set is exactly
/// `labels`, in any order; with no labels, that of the unlabelled line
/// `name value`. An exact set, not "has these labels": it tells
/// `destination="orders"` apart from `source="billing",destination="orders"`,
/// and an unlabelled series from a labelled one.
pub fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted = labels.to_vec();
    wanted.sort_unstable();
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (shown, rest) = match rest.strip_prefix('{') {
            Some(inside) => labels_and_rest(inside)?,
            None => (Vec::new(), rest),
        };
        // The space also keeps `name_bucket` and the like from passing for `name`.
        let value = rest.strip_prefix(' ')?.split_whitespace().next()?;
        let mut shown: Vec<(&str, &str)> = shown.iter().map(|(key, value)| (*key, value.as_str())).collect();
        shown.sort_unstable();
        (shown == wanted).then(|| value.parse().ok())?
    })
}

/// The labels of a line, from just past its `{`, with their values
/// unescaped, and what follows the closing `}`. A value is read up to its
/// closing quote, never split at a comma, since it may hold commas (and
/// escaped quotes) of its own. `None` for a line that is not well formed.
fn labels_and_rest(mut rest: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, quoted) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let closing_quote = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    escaped => value.push(escaped),
                },
                (_, other) => value.push(other),
            }
        };
        labels.push((key, value));
        rest = &quoted[closing_quote + 1..];
        if let Some(next) = rest.strip_prefix(',') {
            rest = next;
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

/// A series a test expects `/metrics` to show: the metric's name, its
/// label set (as [`series`] matches it) and its value.
pub type ExpectedSeries<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

/// Waits until `GET http://127.0.0.1:port/metrics` shows every series of
/// `expected` with its value in one answer; after `within`, panics with
/// each expected value beside the one shown, and what `/metrics` last
/// answered.
pub async fn metrics_show(port: u16, within: Duration, expected: &[ExpectedSeries<'_>]) {
    let deadline = Instant::now() + within;
    loop {
        let answer = http_get(port, "/metrics").await;
        let text = match &answer {
            Some((200, text)) => text.as_str(),
            _ => "",
        };
        let shown: Vec<Option<f64>> = expected
            .iter()
            .map(|(name, labels, _)| series(text, name, labels))
            .collect();
        if shown
            .iter()
            .zip(expected)
            .all(|(got, (_, _, want))| *got == Some(*want))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics did not show every expected value within {within:?}:\n{}\n{}",
            expected_beside_shown(expected, &shown),
            match &answer {
                Some((200, text)) => format!("It answered:\n{text}"),
                Some((status, body)) => format!("It answered {status}: {body}"),
                None => format!("Nothing answered on port {port}."),
            }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One line per expected series, `name{labels}: expected E, shown S`, the
/// labels written as the exposition writes them.
fn expected_beside_shown(expected: &[ExpectedSeries<'_>], shown: &[Option<f64>]) -> String {
    let lines: Vec<String> = expected
        .iter()
        .zip(shown)
        .map(|((name, labels, want), got)| {
            let labels: Vec<String> = labels
                .iter()
                .map(|(key, value)| format!("{key}={value:?}"))
                .collect();
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", labels.join(","))
            };
            let got = got.map_or_else(|| "no such series".to_owned(), |got| got.to_string());
            format!("  {name}{labels}: expected {want}, shown {got}")
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::series;

    const TEXT: &str = "# TYPE outbox_events_published counter\n\
                        outbox_events_published_total{destination=\"orders\"} 30\n\
                        outbox_events_published_total{destination=\"\"} 2\n\
                        outbox_events_published_total{source=\"billing\",destination=\"orders\"} 7\n\
                        outbox_destination_ready{destination=\"ledger\"} 0\n\
                        outbox_destination_ready{destination=\"a,b\",note=\"say \\\"hi\\\"\"} 1\n\
                        outbox_unpublished_events 13\n\
                        outbox_publish_lag_seconds_bucket{le=\"0.1\"} 4\n\
                        outbox_publish_lag_seconds_count 4\n";

    #[test]
    fn reads_a_labelled_value_by_its_exact_label_set() {
        assert_eq!(
            series(
                TEXT,
                "outbox_events_published_total",
                &[("destination", "orders")]
            ),
            Some(30.0)
        );
        assert_eq!(
            series(TEXT, "outbox_events_published_total", &[("destination", "")]),
            Some(2.0)
        );
        assert_eq!(
            series(
                TEXT,
                "outbox_events_published_total",
                &[("destination", "orders"), ("source", "billing")]
            ),
            Some(7.0),
            "in any order"
        );
        assert_eq!(
            series(TEXT, "outbox_destination_ready", &[("destination", "ledger")]),
            Some(0.0)
        );
    }

    #[test]
    fn reads_an_unlabelled_value() {
        assert_eq!(series(TEXT, "outbox_unpublished_events", &[]), Some(13.0));
        assert_eq!(series(TEXT, "outbox_publish_lag_seconds_count", &[]), Some(4.0));
    }

    #[test]
    fn finds_nothing_for_a_series_not_shown() {
        assert_eq!(
            series(TEXT, "outbox_destination_ready", &[("destination", "orders")]),
            None
        );
        assert_eq!(
            series(TEXT, "outbox_events_published_total", &[]),
            None,
            "only labelled lines"
        );
        assert_eq!(
            series(TEXT, "outbox_unpublished_events", &[("source", "orders")]),
            None,
            "only an unlabelled line"
        );
        assert_eq!(
            series(TEXT, "outbox_events_published_total", &[("source", "billing")]),
            None,
            "a part of a label set is not the set"
        );
        assert_eq!(
            series(TEXT, "outbox_publish_lag_seconds", &[("le", "0.1")]),
            None,
            "a longer name is another metric"
        );
        assert_eq!(series("", "outbox_unpublished_events", &[]), None);
    }

    #[test]
    fn reads_a_label_value_that_holds_a_comma_or_an_escaped_quote() {
        assert_eq!(
            series(
                TEXT,
                "outbox_destination_ready",
                &[("destination", "a,b"), ("note", "say \"hi\"")]
            ),
            Some(1.0)
        );
        assert_eq!(
            series(TEXT, "outbox_destination_ready", &[("destination", "a")]),
            None
        );
    }
}
