//! The server on a real socket, spoken to in raw HTTP/1.1.

use axum::routing::get;
use axum::Router;
use forgelog_http::{HttpOptions, HttpServer};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn server(header_read_timeout: Duration) -> HttpServer {
    let router = Router::new()
        .route("/quick", get(|| async { "quick" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow"
            }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "never"
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    HttpServer::start(
        listener,
        router,
        HttpOptions {
            header_read_timeout,
        },
    )
    .unwrap()
}

async fn get_path(server: &HttpServer, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s
}

/// Reads until the peer closes; what came, and how long it took.
async fn read_to_close(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn half_a_header_is_closed_after_the_header_read_timeout() {
    let server = server(Duration::from_millis(500)).await;
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(b"GET /quick HTTP/1.1\r\nHost: x\r\nX-Slow")
        .await
        .unwrap();
    let started = Instant::now();
    let answer = read_to_close(&mut s, Duration::from_secs(10)).await;
    assert!(answer.is_some(), "still open after 10 s");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The server is fine, and serves whole requests.
    let mut s = get_path(&server, "/quick").await;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("quick"));
    assert!(server.shutdown(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish_within_the_grace() {
    let server = server(Duration::from_secs(30)).await;
    let mut s = get_path(&server, "/slow").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(server.shutdown(Duration::from_secs(10)).await);
    let answer = read_to_close(&mut s, Duration::from_secs(5)).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow"),
        "{answer}"
    );
}

#[tokio::test]
async fn shutdown_does_not_wait_past_its_grace_on_a_hanging_request() {
    let server = server(Duration::from_secs(30)).await;
    let mut s = get_path(&server, "/hang").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert!(!server.shutdown(Duration::from_millis(500)).await);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        read_to_close(&mut s, Duration::from_secs(5))
            .await
            .as_deref(),
        Some("")
    );
}
