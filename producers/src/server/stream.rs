//! Answering a streaming call as SSE: keep-alive comments while the upstream
//! works (harnesses give up on a silent stream), then the dialect's events.

use super::call::Answered;
use super::finish::FinishesAnyway;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use forgelog_dialects::dialect::sse::KEEP_ALIVE;
use forgelog_dialects::dialect::{DialectAdapter, DialectError, ErrorKind};
use std::time::Duration;

/// The SSE response of a call whose answer `work` will give.
pub(super) fn sse_response<D: DialectAdapter>(
    mut work: FinishesAnyway<Answered>,
    keep_alive: Duration,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        let events = loop {
            tokio::select! {
                done = &mut work => break match done {
                    Ok((req, Ok((resp, _)))) => D::stream_events(&resp, &req),
                    Ok((_, Err(err))) => vec![D::stream_error(&err)],
                    Err(_) => vec![D::stream_error(&DialectError::new(ErrorKind::Internal, "the call failed inside the proxy"))],
                },
                _ = tick.tick() => if tx.send(Bytes::from_static(KEEP_ALIVE)).await.is_err() { return },
            }
        };
        for e in events.iter().chain(D::stream_end().as_ref()) {
            if tx.send(e.frame()).await.is_err() {
                return;
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("static headers")
}
