//! forgelog-http: an axum router served on an open port with the limits such
//! a port needs, which `axum::serve` does not set: a connection that sends
//! half a header is closed after [`HttpOptions::header_read_timeout`]
//! (slowloris), and shutting down waits for the requests in flight for a
//! bounded grace, then closes what is left instead of waiting on it.

pub mod telemetry;

use axum::http::HeaderMap;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// 256 random bits as `fl-<hex>`: session keys and admin tokens.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("fl-{hex}")
}

/// The token of `Authorization: Bearer TOKEN`.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
}

/// Whether `headers` carry `token` as their bearer token, compared in
/// constant time (a timing oracle would leak it a byte at a time).
pub fn is_bearer(headers: &HeaderMap, token: &str) -> bool {
    bearer(headers).is_some_and(|given| {
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// A client must send a request's whole header within this time (an idle
    /// keep-alive connection is closed after it too, as servers do).
    pub header_read_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// A router being served; [`HttpServer::shutdown`] stops it.
pub struct HttpServer {
    addr: SocketAddr,
    stop: oneshot::Sender<Duration>,
    task: tokio::task::JoinHandle<bool>,
}

impl HttpServer {
    /// Serves `router` on `listener` in the current runtime.
    pub fn start(
        listener: TcpListener,
        router: Router,
        options: HttpOptions,
    ) -> std::io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, router, options, stopped));
        Ok(HttpServer { addr, stop, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets the requests in flight finish for up to `grace`,
    /// then closes every connection left. Whether all finished in time.
    pub async fn shutdown(self, grace: Duration) -> bool {
        let _ = self.stop.send(grace);
        self.task.await.unwrap_or(false)
    }
}

async fn accept(
    listener: TcpListener,
    router: Router,
    options: HttpOptions,
    mut stopped: oneshot::Receiver<Duration>,
) -> bool {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let grace = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, say: wait a moment, not spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                connections.spawn(async move {
                    let _ = connection.await;
                });
                // Reap the finished ones as we go.
                while connections.try_join_next().is_some() {}
            }
            grace = &mut stopped => break grace.unwrap_or_default(),
        }
    };
    drop(listener);
    let finished = tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_ok();
    if !finished {
        tracing::warn!(
            ?grace,
            left = connections.len(),
            "requests still running after the shutdown grace: closing their connections"
        );
    }
    connections.shutdown().await;
    finished
}
