//! The SQS client: region, endpoint, SDK retries and timeouts.

use std::time::Duration;

use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Region};
use aws_sdk_sqs::Client;
use tracing::{info, warn};

use super::SqsConfig;

/// Region used when none is configured anywhere and the queue URL does not
/// name one (an emulator URL): emulators accept any region, but SigV4
/// needs one.
const FALLBACK_REGION: &str = "us-east-1";

/// Builds the client from the standard AWS configuration chain
/// (environment, profile, web identity for IRSA, container and instance
/// metadata). Nothing is sent here: credentials are resolved and the
/// queue is reached on first use.
///
/// Region: a queue URL on AWS names its region
/// (`https://sqs.eu-west-1.amazonaws.com/…`), and requests must go
/// there, so that region wins. Otherwise (an emulator URL) the standard
/// chain decides (`AWS_REGION`, profile, instance metadata), and
/// `us-east-1` if it finds none.
pub(super) async fn build(config: &SqsConfig) -> Client {
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
    Client::from_conf(builder.build())
}

/// Settings for the readiness probe's `GetQueueAttributes`. Readiness
/// must answer within the health probe's time, so no long SDK retries
/// here; the relay retries with its own backoff.
pub(super) fn probe_override() -> aws_sdk_sqs::config::Builder {
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
        )
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
