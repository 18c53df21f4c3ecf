//! The server on a real socket, spoken to in raw HTTP/1.1 and HTTP/2 frames.

use axum::routing::get;
use axum::Router;
use forgelog_http::{HttpOptions, HttpServer};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

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

/// The server is fine after what a test did: it serves a whole request, and
/// shuts down at once.
async fn still_serves(server: HttpServer) {
    let mut s = get_path(&server, "/quick").await;
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("quick"));
    assert!(server.shutdown(Duration::from_secs(1)).await);
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
    still_serves(server).await;
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

/// An HTTP/2 client with prior knowledge: the preface and an empty SETTINGS
/// frame.
async fn h2c_connect(server: &HttpServer) -> TcpStream {
    let mut s = TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    s
}

/// Plays a well-behaved HTTP/2 client that never sends a request: answers
/// the server's SETTINGS and PINGs, as every HTTP/2 library does by itself,
/// until the server closes. Whether it closed within `within`.
async fn idle_politely(mut s: TcpStream, within: Duration) -> bool {
    let talk = async {
        loop {
            let mut header = [0u8; 9];
            if s.read_exact(&mut header).await.is_err() {
                return;
            }
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let (kind, flags) = (header[3], header[4]);
            let mut payload = vec![0u8; len];
            if s.read_exact(&mut payload).await.is_err() {
                return;
            }
            let ack: Option<Vec<u8>> = match (kind, flags & 1) {
                (4, 0) => Some(vec![0, 0, 0, 4, 1, 0, 0, 0, 0]),
                (6, 0) => Some([&[0, 0, 8, 6, 1, 0, 0, 0, 0][..], &payload].concat()),
                _ => None,
            };
            if let Some(ack) = ack {
                if s.write_all(&ack).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(within, talk).await.is_ok()
}

#[tokio::test]
async fn idle_http2_connections_are_closed_whether_or_not_they_answer_pings() {
    let server = server(Duration::from_millis(500)).await;
    let mut polite = JoinSet::new();
    for _ in 0..200 {
        let s = h2c_connect(&server).await;
        polite.spawn(idle_politely(s, Duration::from_secs(10)));
    }
    // One that sends its preface and then reads nothing, answers nothing.
    let mut mute = h2c_connect(&server).await;
    let started = Instant::now();
    while let Some(closed) = polite.join_next().await {
        assert!(
            closed.unwrap(),
            "an idle HTTP/2 connection still open after 10 s"
        );
    }
    assert!(
        read_to_close(&mut mute, Duration::from_secs(10))
            .await
            .is_some(),
        "a mute HTTP/2 connection still open after 10 s"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    still_serves(server).await;
}

#[tokio::test]
async fn a_request_longer_than_the_idle_time_is_answered_whole() {
    let server = server(Duration::from_millis(200)).await;
    let mut s = get_path(&server, "/slow").await;
    let answer = read_to_close(&mut s, Duration::from_secs(5)).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow"),
        "{answer}"
    );
    assert!(server.shutdown(Duration::from_secs(1)).await);
}
