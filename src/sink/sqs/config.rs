//! The SQS sink's settings and their validation, kept beside the sink that
//! reads them; [`SinkSettings`](crate::sink::SinkSettings) calls
//! [`SqsConfig::from_settings`] for `OUTBOX_SINK=sqs`.

use crate::settings::{var, ConfigError};

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

    /// Validates `OUTBOX_SQS_QUEUE_URL` (required) and
    /// `OUTBOX_SQS_ENDPOINT_URL` (optional; blank means unset).
    pub fn from_settings(
        queue_url: Option<&str>,
        endpoint_url: Option<&str>,
    ) -> Result<SqsConfig, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";

    #[test]
    fn http_urls_without_credentials_pass() {
        assert_eq!(validate_http_url(QUEUE), Ok(()));
        assert_eq!(validate_http_url("http://127.0.0.1:4566/000000000000/q"), Ok(()));
        // A user name alone is no secret; only a password is refused.
        assert_eq!(validate_http_url("http://user@localhost:9324/q"), Ok(()));
        assert!(validate_http_url("not a url")
            .unwrap_err()
            .starts_with("is not a valid URL"));
        assert_eq!(
            validate_http_url("amqp://localhost/q").unwrap_err(),
            "scheme 'amqp' is not http or https"
        );
        assert_eq!(
            validate_http_url("https://key:hunter2@sqs.eu-west-1.amazonaws.com/1/q").unwrap_err(),
            "must not carry credentials; use the AWS credential chain"
        );
    }

    #[test]
    fn the_queue_url_is_required_and_trimmed() {
        for missing in [None, Some(""), Some("  ")] {
            let error = SqsConfig::from_settings(missing, None).unwrap_err();
            assert_eq!(error.variable, "OUTBOX_SQS_QUEUE_URL");
            assert_eq!(error.problem, "is required when OUTBOX_SINK=sqs");
        }
        let padded = format!(" {QUEUE}\n");
        let config = SqsConfig::from_settings(Some(&padded), None).unwrap();
        assert_eq!(config.queue_url, QUEUE);
        assert_eq!(config.endpoint_url, None);
        assert!(!config.is_fifo());
        let fifo = SqsConfig::from_settings(Some("http://localhost:4566/1/orders.fifo"), None).unwrap();
        assert!(fifo.is_fifo());
    }

    #[test]
    fn a_blank_endpoint_means_none_and_a_bad_one_names_its_variable() {
        for blank in [None, Some(""), Some(" ")] {
            let config = SqsConfig::from_settings(Some(QUEUE), blank).unwrap();
            assert_eq!(config.endpoint_url, None);
        }
        let config = SqsConfig::from_settings(Some(QUEUE), Some(" http://127.0.0.1:4566 ")).unwrap();
        assert_eq!(config.endpoint_url.as_deref(), Some("http://127.0.0.1:4566"));
        let error = SqsConfig::from_settings(Some(QUEUE), Some("ftp://127.0.0.1")).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_SQS_ENDPOINT_URL");
        let error = SqsConfig::from_settings(Some("ftp://127.0.0.1/q"), Some("ftp://127.0.0.1")).unwrap_err();
        assert_eq!(
            error.variable, "OUTBOX_SQS_QUEUE_URL",
            "the queue URL is checked first"
        );
    }

    #[test]
    fn errors_never_echo_the_password() {
        let error = SqsConfig::from_settings(Some("https://k:hunter2@h/1/q"), None).unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let error = SqsConfig::from_settings(Some(QUEUE), Some("http://k:hunter2@h")).unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}
