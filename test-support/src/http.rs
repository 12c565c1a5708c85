//! The relay's HTTP endpoints as a test reads them.

use std::time::Duration;

/// `GET http://127.0.0.1:port/path`: status and body, `None` while nothing
/// answers (within 10 s).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");
    let response = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}
