//! A TCP proxy the test controls, so a test can cut the relay's own
//! connections to a shared server without disturbing anyone else's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections to `target` until cut.
pub struct Proxy {
    pub addr: SocketAddr,
    generation: watch::Sender<u64>,
    refusing: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral local port.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (generation, _) = watch::channel(0u64);
        let refusing = Arc::new(AtomicBool::new(false));
        let task = {
            let generation = generation.clone();
            let refusing = refusing.clone();
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let mut cut = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
