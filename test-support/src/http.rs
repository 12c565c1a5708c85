//! The relay's HTTP endpoints as a test reads them.

use std::net::SocketAddr;
use std::time::Duration;

/// `GET http://127.0.0.1:port/path`: status and body, `None` while nothing
/// answers (within 10 s).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at(
        SocketAddr::from(([127, 0, 0, 1], port)),
        path,
        Duration::from_secs(10),
    )
    .await
}

/// `GET http://addr/path`, given up after `timeout`: status and body,
/// `None` while nothing answers.
pub async fn http_get_at(addr: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .expect("HTTP client");
    let response = client.get(format!("http://{addr}{path}")).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}
