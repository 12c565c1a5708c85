//! SQS test support: a queue of its own per test on the emulator that
//! `scripts/test` starts (moto), a consumer that reads every field back, and
//! the relay settings that publish to it.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use uuid::Uuid;

/// Where the tests find the SQS emulator.
pub fn endpoint() -> String {
    std::env::var("OUTBOX_TEST_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// The emulator's socket address, for a proxy in front of it.
pub fn endpoint_addr() -> SocketAddr {
    let url = url::Url::parse(&endpoint()).expect("OUTBOX_TEST_SQS_ENDPOINT is a URL");
    let host = url.host_str().expect("OUTBOX_TEST_SQS_ENDPOINT has a host");
    let port = url
        .port_or_known_default()
        .expect("OUTBOX_TEST_SQS_ENDPOINT has a port");
    (host, port)
        .to_socket_addrs()
        .expect("resolve the SQS emulator")
        .next()
        .expect("the SQS emulator has an address")
}

/// The emulator ignores credentials but SigV4 signing needs some; these go
/// to the relay and to the test's own client.
pub const ACCESS_KEY: &str = "test";
pub const SECRET_KEY: &str = "test";
pub const REGION: &str = "us-east-1";

/// The AWS settings every relay publishing to the emulator needs, whichever
/// way its queue is configured: the SDK reads them from the environment.
pub fn aws_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ("AWS_REGION", REGION.into()),
    ]
}

/// A client for the emulator at `endpoint_url`.
pub fn client(endpoint_url: &str) -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "outbox-tests",
        ))
        .endpoint_url(endpoint_url)
        .build();
    Client::from_conf(config)
}

/// A message as a consumer received it.
#[derive(Debug, Clone)]
pub struct SqsReceived {
    pub body: String,
    /// Message attributes: name → (data type, string value).
    pub attributes: HashMap<String, (String, Option<String>)>,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    pub receipt_handle: String,
}

impl SqsReceived {
    /// A string attribute's value.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(|(_, value)| value.as_deref())
    }

    /// The `event_id` attribute.
    pub fn event_id(&self) -> String {
        self.attribute("event_id").unwrap_or_default().to_owned()
    }
}

/// A queue of its own for one test, deleted by [`TestQueue::cleanup`].
pub struct TestQueue {
    pub client: Client,
    pub name: String,
    pub url: String,
    /// The emulator the queue is on, to delete it from [`Drop`].
    endpoint: String,
    deleted: bool,
}

impl TestQueue {
    /// Creates a standard queue (`fifo` false) or a FIFO queue, with
    /// `MaximumMessageSize` set when given. Panics with how to start the
    /// emulator if it does not answer: these tests never skip.
    pub async fn create(fifo: bool, max_message_size: Option<u32>) -> Self {
        Self::create_at(&endpoint(), fifo, max_message_size).await
    }

    /// [`TestQueue::create`] on the emulator at `endpoint`.
    pub async fn create_at(endpoint: &str, fifo: bool, max_message_size: Option<u32>) -> Self {
        let client = client(endpoint);
        let suffix = if fifo { ".fifo" } else { "" };
        let name = format!("outbox-test-{}{suffix}", Uuid::new_v4().simple());
        let mut request = client.create_queue().queue_name(&name);
        if fifo {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        if let Some(size) = max_message_size {
            request = request.attributes(QueueAttributeName::MaximumMessageSize, size.to_string());
        }
        let created = request.send().await.unwrap_or_else(|e| {
            panic!(
                "cannot reach the SQS emulator at {}: {}\n\
                 run the tests with scripts/test (it starts moto), or start one with \
                 `moto_server -p 4566` (or set OUTBOX_TEST_SQS_ENDPOINT)",
                endpoint,
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        });
        let url = created
            .queue_url()
            .expect("CreateQueue returns the URL")
            .to_owned();
        Self {
            client,
            name,
            url,
            endpoint: endpoint.to_owned(),
            deleted: false,
        }
    }

    /// The relay settings that publish to this queue through `endpoint_url`
    /// (the emulator, or a proxy in front of it).
    pub fn env_via(&self, endpoint_url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OUTBOX_SINK", "sqs".into()),
            ("OUTBOX_SQS_QUEUE_URL", self.url.clone()),
            ("OUTBOX_SQS_ENDPOINT_URL", endpoint_url.into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", REGION.into()),
        ]
    }

    /// The relay settings that publish to this queue on the emulator.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.env_via(&self.endpoint)
    }

    /// The settings of a configuration file's `[[destination]]` (sink
    /// `sqs`) that publishes to this queue through `endpoint_url` (the
    /// emulator, or a proxy in front of it). The credentials and region
    /// stay in the environment: [`aws_env`].
    pub fn destination_settings_via(&self, endpoint_url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("sqs_queue_url", self.url.clone()),
            ("sqs_endpoint_url", endpoint_url.to_owned()),
        ]
    }

    /// [`TestQueue::destination_settings_via`] the emulator.
    pub fn destination_settings(&self) -> Vec<(&'static str, String)> {
        self.destination_settings_via(&self.endpoint)
    }

    /// One `ReceiveMessage` call (long-polling up to a second), with every
    /// attribute; messages stay invisible for `visibility` seconds.
    pub async fn receive_once(&self, visibility: i32) -> Vec<SqsReceived> {
        let answer = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(visibility)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .expect("ReceiveMessage");
        answer
            .messages()
            .iter()
            .map(|message| {
                let system = message.attributes();
                let system_attribute = |name: MessageSystemAttributeName| {
                    system.and_then(|attributes| attributes.get(&name)).cloned()
                };
                SqsReceived {
                    body: message.body().unwrap_or_default().to_owned(),
                    attributes: message
                        .message_attributes()
                        .map(|attributes| {
                            attributes
                                .iter()
                                .map(|(name, value)| {
                                    (
                                        name.clone(),
                                        (
                                            value.data_type().to_owned(),
                                            value.string_value().map(str::to_owned),
                                        ),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    group_id: system_attribute(MessageSystemAttributeName::MessageGroupId),
                    deduplication_id: system_attribute(MessageSystemAttributeName::MessageDeduplicationId),
                    receipt_handle: message.receipt_handle().unwrap_or_default().to_owned(),
                }
            })
            .collect()
    }

    /// Receives (and deletes) messages until `count` arrived or `within`
    /// passed; returns what arrived, in the order received.
    pub async fn receive(&self, count: usize, within: Duration) -> Vec<SqsReceived> {
        let deadline = tokio::time::Instant::now() + within;
        let mut received = Vec::new();
        while received.len() < count && tokio::time::Instant::now() < deadline {
            let batch = self.receive_once(120).await;
            for message in &batch {
                self.delete(message).await;
            }
            received.extend(batch);
        }
        received
    }

    /// Deletes one received message.
    pub async fn delete(&self, message: &SqsReceived) {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&message.receipt_handle)
            .send()
            .await
            .expect("DeleteMessage");
    }

    /// Deletes the queue (dropping it does the same; this waits for it).
    pub async fn cleanup(mut self) {
        let _ = self.client.delete_queue().queue_url(&self.url).send().await;
        self.deleted = true;
    }
}

impl Drop for TestQueue {
    /// Deletes the queue also when the test panicked, so a failing test
    /// leaves nothing behind in the shared emulator (moto slows down with
    /// everything it holds).
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let (url, endpoint) = (self.url.clone(), self.endpoint.clone());
        // Drop runs inside the test's runtime, whose client cannot be used
        // from another; a plain thread with its own runtime and client can.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    let _ = client(&endpoint).delete_queue().queue_url(&url).send().await;
                });
            }
        })
        .join();
    }
}
