//! forgelog-http: an axum router served on an open port with the limits such
//! a port needs, which `axum::serve` does not set: a connection that sends
//! half a header, or starts no request for
//! [`HttpOptions::header_read_timeout`], is closed, over HTTP/1 and HTTP/2
//! alike (slowloris), and shutting down waits for the requests in flight for
//! a bounded grace, then closes what is left instead of waiting on it.

mod logs;
pub mod telemetry;

pub use logs::init_logs;

use axum::http::HeaderMap;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

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

/// Whether `headers` carry `token` as their bearer token (see [`token_matches`]).
pub fn is_bearer(headers: &HeaderMap, token: &str) -> bool {
    bearer(headers).is_some_and(|given| token_matches(given, token))
}

/// Whether a caller's `given` key is `token`, compared in constant time (a
/// timing oracle would leak it a byte at a time). A blank token matches
/// nothing: an empty header must never open a door.
pub fn token_matches(given: &str, token: &str) -> bool {
    !token.trim().is_empty()
        && given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Binds `addr` for a server. Its error names the address ("Address
/// already in use" alone did not); the caller may add which flag it was.
pub async fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}

/// clap's parser for a flag or variable that holds an admin token: a blank
/// one is refused at start rather than served.
pub fn admin_token_arg(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("an empty admin token would let in any caller that sends an empty key".into())
    } else {
        Ok(value.to_string())
    }
}

/// clap's parser for a flag or variable that holds an HTTP server's root
/// URL (an engine, a proxy): `http://` or `https://` and a host, without the
/// `/v1` an OpenAI base URL ends in (forgelog adds its routes), the trailing
/// `/` dropped. Refused at start, naming the URL meant: unchecked,
/// `127.0.0.1:8000` failed every request later ("relative URL without a
/// base"), or a harness's base URL ending in `/v1` got 404s.
pub fn http_url_arg(value: &str) -> Result<String, String> {
    let given = value.trim();
    if !given.contains("://") {
        return Err(format!("not a URL: say http://{given}"));
    }
    let url = url::Url::parse(given).map_err(|e| format!("not a URL ({e})"))?;
    let value = given.trim_end_matches('/');
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{}:// is not HTTP: say http://", url.scheme()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a server's root URL has no query or fragment".into());
    }
    if let Some(root) = value.strip_suffix("/v1") {
        return Err(format!(
            "the server's root, not its OpenAI base URL: say {root}"
        ));
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_url_is_its_root_over_http_or_a_refusal_naming_the_url_meant() {
        for (given, root) in [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
            (" https://vllm.internal/ ", "https://vllm.internal"),
            ("http://gateway:80/pool-a/", "http://gateway:80/pool-a"),
        ] {
            assert_eq!(http_url_arg(given).as_deref(), Ok(root), "{given}");
        }
        for (given, said) in [
            ("127.0.0.1:8000", "not a URL: say http://127.0.0.1:8000"),
            ("localhost:8000", "not a URL: say http://localhost:8000"),
            ("http://", "not a URL (empty host)"),
            ("ftp://10.0.0.1:21", "ftp:// is not HTTP: say http://"),
            (
                "http://h:1/?a=1",
                "a server's root URL has no query or fragment",
            ),
            (
                "http://127.0.0.1:8000/v1/",
                "the server's root, not its OpenAI base URL: say http://127.0.0.1:8000",
            ),
        ] {
            assert_eq!(http_url_arg(given), Err(said.to_string()), "{given}");
        }
    }

    #[test]
    fn a_blank_token_matches_nothing_and_is_refused_as_an_argument() {
        assert!(token_matches("fl-secret", "fl-secret"));
        assert!(!token_matches("fl-secreT", "fl-secret"));
        assert!(!token_matches("fl-secret-", "fl-secret"));
        for blank in ["", " ", "\t"] {
            assert!(!token_matches(blank, blank), "{blank:?}");
            assert!(admin_token_arg(blank).is_err(), "{blank:?}");
        }
        assert_eq!(admin_token_arg("fl-x").unwrap(), "fl-x");
    }
}

#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// A client must send a request's whole header within this time, and a
    /// connection that starts no request for about this long is closed
    /// (gracefully: what is in flight finishes), over HTTP/1 and HTTP/2.
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
    // A graceful HTTP/2 shutdown waits for the client to answer a PING; one
    // that never answers is closed by the keep-alive timeout instead.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(options.header_read_timeout))
        .keep_alive_timeout(options.header_read_timeout);
    let (closing, _) = watch::channel(false);
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
                let requests = Arc::new(AtomicU64::new(0));
                let counted = requests.clone();
                let service = TowerToHyperService::new(router.clone().map_request(
                    move |request: axum::extract::Request<hyper::body::Incoming>| {
                        counted.fetch_add(1, Ordering::Relaxed);
                        request
                    },
                ));
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                connections.spawn(serve_connection(
                    connection,
                    requests,
                    options.header_read_timeout,
                    closing.subscribe(),
                ));
                // Reap the finished ones as we go.
                while connections.try_join_next().is_some() {}
            }
            grace = &mut stopped => break grace.unwrap_or_default(),
        }
    };
    drop(listener);
    let _ = closing.send(true);
    let finished = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
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

/// Drives one connection to its end, shutting it down gracefully when the
/// server closes or when no request started on it for a whole `idle`
/// period. HTTP/1's header timeout alone leaves an HTTP/2 connection that
/// never sends a request open for ever; a graceful shutdown still lets the
/// requests in flight (a long stream, say) finish.
async fn serve_connection<C: GracefulConnection>(
    connection: C,
    requests: Arc<AtomicU64>,
    idle: Duration,
    mut closing: watch::Receiver<bool>,
) {
    let mut connection = std::pin::pin!(connection);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + idle, idle);
    let mut seen = 0;
    let mut shutting_down = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = ticks.tick(), if !shutting_down => {
                let started = requests.load(Ordering::Relaxed);
                if started == seen {
                    connection.as_mut().graceful_shutdown();
                    shutting_down = true;
                }
                seen = started;
            }
            _ = closing.changed(), if !shutting_down => {
                connection.as_mut().graceful_shutdown();
                shutting_down = true;
            }
        }
    }
}
