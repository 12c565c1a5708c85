//! A TCP proxy the test controls, so a test can cut the relay's own
//! connections to a shared server without disturbing anyone else's, make
//! them slow (a round trip of a known length), or make them stall (a
//! server that stops answering while its connections stay open).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections to `target` until cut.
pub struct Proxy {
    pub addr: SocketAddr,
    generation: watch::Sender<u64>,
    refusing: Arc<AtomicBool>,
    stalled: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral local port.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_with_latency(target, Duration::ZERO).await
    }

    /// A proxy in front of the server `url` names (its host and port, or
    /// the scheme's default port), and `url` rewritten to reach that server
    /// through it: give the rewritten URL to the relay, and cutting or
    /// refusing here takes the server away from that relay alone.
    pub async fn in_front_of(url: &str) -> (Self, String) {
        Self::in_front_of_with_latency(url, Duration::ZERO).await
    }

    /// [`Proxy::in_front_of`], with the latency of
    /// [`Proxy::start_with_latency`].
    pub async fn in_front_of_with_latency(url: &str, latency: Duration) -> (Self, String) {
        let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url} is not a URL: {e}"));
        let host = parsed.host_str().unwrap_or_else(|| panic!("{url} names no host"));
        let port = parsed
            .port_or_known_default()
            .or_else(|| parsed.scheme().starts_with("amqp").then_some(5672))
            .unwrap_or_else(|| panic!("{url} names no port"));
        let target = tokio::net::lookup_host((host, port))
            .await
            .unwrap_or_else(|e| panic!("resolve {host}: {e}"))
            .next()
            .unwrap_or_else(|| panic!("{host} has no address"));
        let proxy = Self::start_with_latency(target, latency).await;
        let mut via = parsed.clone();
        via.set_host(Some("127.0.0.1"))
            .expect("a URL with a host takes another");
        via.set_port(Some(proxy.addr.port()))
            .expect("a URL with a host takes a port");
        (proxy, via.to_string())
    }

    /// Like [`Proxy::start`], holding everything read in either direction
    /// for `latency` before passing it on: what arrives meanwhile goes with
    /// it, so pipelined requests share one delay, and a client waiting for
    /// each answer before the next request pays it every time.
    pub async fn start_with_latency(target: SocketAddr, latency: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (generation, _) = watch::channel(0u64);
        let refusing = Arc::new(AtomicBool::new(false));
        let (stalled, _) = watch::channel(false);
        let task = {
            let generation = generation.clone();
            let refusing = refusing.clone();
            let stalled = stalled.clone();
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let mut cut = generation.subscribe();
                    let stalled = stalled.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        // As the clients and servers behind it do: with
                        // Nagle's algorithm a small write waits for the
                        // ACK of the one before, and the proxy would add
                        // delays of its own to pipelined requests.
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let (from_client, to_client) = inbound.split();
                        let (from_server, to_server) = outbound.split();
                        tokio::select! {
                            _ = pump(from_client, to_server, latency, stalled.clone()) => {}
                            _ = pump(from_server, to_client, latency, stalled) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            })
        };
        Self {
            addr,
            generation,
            refusing,
            stalled,
            task,
        }
    }

    /// Drops every open connection (new ones still go through).
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Refuses (closes at once) new connections while `on`.
    pub fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    /// While `on`, passes nothing on in either direction: connections stay
    /// open and every request goes unanswered, as with a server that hangs
    /// or a network that drops packets. What was held goes on afterwards.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }
}

/// Copies `from` to `to`, each read held for `latency` first, and nothing
/// read while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    latency: Duration,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if stalled.wait_for(|stalled| !*stalled).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = stalled.changed() => continue,
        };
        let Ok(read) = read else {
            return;
        };
        if read == 0 {
            return;
        }
        let mut pending = buffer[..read].to_vec();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
            // What came while sleeping goes out with this read, in order.
            loop {
                match from.try_read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(more) => pending.extend_from_slice(&buffer[..more]),
                }
            }
        }
        if stalled.wait_for(|stalled| !*stalled).await.is_err() {
            return;
        }
        if to.write_all(&pending).await.is_err() {
            return;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
