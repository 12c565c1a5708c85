//! `amqps://` with the relay's own rustls configuration (the CA file, or
//! the system's CAs, and the client certificate), rather than lapin's
//! default TLS set-up, which adds a CA file to the system's CAs instead of
//! trusting it alone: a broker with a private CA is then checked against
//! that CA only, as PostgreSQL's `sslrootcert` is.

use std::net::SocketAddr;

use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};

use super::AmqpTls;

/// Opens a connection to the `amqps://` URL `url` over TLS as `tls` says.
pub(super) async fn connect(
    url: &str,
    tls: &AmqpTls,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    let uri: AMQPUri = url
        .parse()
        .map_err(|e: String| lapin::Error::from(std::io::Error::other(e)))?;
    let runtime = lapin::runtime::default_runtime()?;
    let connector = RustlsConnector::from(tls.config.clone());
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let host = uri.authority.host.clone();
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), uri.authority.port))
                .await?
                .collect();
            let stream = AsyncTcpStream::connect(&runtime, addresses).await?;
            Ok(stream.into_rustls(&connector, &host).await?)
        },
        properties,
    )
    .await
}
