//! The viewer's routes: pages rendered from the index on each request, and a
//! server-sent event stream per page that says when its run has grown.

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use forgelog_view_core::{PageError, Pages, TokenText, ViewIndex, SCRIPT, STYLE};
use futures::Stream;
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

/// What every request reads: the index the tail fills, the pages, the
/// tokenizer, and the index's generation as it changes.
#[derive(Clone)]
pub struct ViewState {
    pub index: Arc<RwLock<ViewIndex>>,
    pub pages: Arc<Pages>,
    pub tokens: Arc<dyn TokenText>,
    pub changes: watch::Receiver<u64>,
}

pub fn router(state: ViewState) -> Router {
    Router::new()
        .route("/", get(runs))
        .route("/live", get(live_all))
        .route("/health", get(|| async { "ok" }))
        .route(
            "/static/view.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css")], STYLE) }),
        )
        .route(
            "/static/view.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], SCRIPT) }),
        )
        .route("/runs/{run}", get(run))
        .route("/runs/{run}/live", get(live_run))
        .route("/runs/{run}/compare", get(compare))
        .route("/runs/{run}/rollouts/{rollout}", get(rollout))
        .route("/runs/{run}/rollouts/{rollout}/paths/{index}", get(path))
        .with_state(state)
}

/// A rendered page, a "not in the log" page (404), or the template's error (500).
fn page(state: &ViewState, rendered: Result<Option<String>, PageError>, what: String) -> Response {
    match rendered {
        Ok(Some(html)) => Html(html).into_response(),
        Ok(None) => match state.pages.missing(&what) {
            Ok(html) => (StatusCode::NOT_FOUND, Html(html)).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        Err(e) => {
            tracing::error!("{e}");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

fn index(state: &ViewState) -> std::sync::RwLockReadGuard<'_, ViewIndex> {
    // A panic while holding the lock leaves the index as it was: still readable.
    state.index.read().unwrap_or_else(|p| p.into_inner())
}

async fn runs(State(state): State<ViewState>) -> Response {
    let rendered = state.pages.runs(&index(&state)).map(Some);
    page(&state, rendered, String::new())
}

async fn run(State(state): State<ViewState>, Path(run): Path<String>) -> Response {
    let rendered = {
        let index = index(&state);
        match index.run(&run) {
            Some(log) => state.pages.run(&run, log).map(Some),
            None => Ok(None),
        }
    };
    page(&state, rendered, format!("The log has no run {run:?}."))
}

async fn rollout(
    State(state): State<ViewState>,
    Path((run, rollout)): Path<(String, String)>,
) -> Response {
    let rendered = {
        let index = index(&state);
        match index.run(&run) {
            Some(log) => state.pages.rollout(&run, log, &rollout, &*state.tokens),
            None => Ok(None),
        }
    };
    page(
        &state,
        rendered,
        format!("Run {run:?} has no rollout {rollout:?}."),
    )
}

async fn path(
    State(state): State<ViewState>,
    Path((run, rollout, at)): Path<(String, String, usize)>,
) -> Response {
    let rendered = {
        let index = index(&state);
        match index.run(&run) {
            Some(log) => state.pages.path(&run, log, &rollout, at, &*state.tokens),
            None => Ok(None),
        }
    };
    page(
        &state,
        rendered,
        format!("Rollout {rollout:?} of run {run:?} has no path {at}."),
    )
}

#[derive(serde::Deserialize)]
struct Pair {
    a: String,
    b: String,
}

async fn compare(
    State(state): State<ViewState>,
    Path(run): Path<String>,
    Query(Pair { a, b }): Query<Pair>,
) -> Response {
    let rendered = {
        let index = index(&state);
        match index.run(&run) {
            Some(log) => state.pages.compare(&run, log, [&a, &b], &*state.tokens),
            None => Ok(None),
        }
    };
    page(
        &state,
        rendered,
        format!("Run {run:?} lacks rollout {a:?} or {b:?}."),
    )
}

/// Sends `count()` now and again whenever the index changes and it differs.
fn changes(
    state: ViewState,
    count: impl Fn(&ViewIndex) -> u64 + Send + Sync + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let count = Arc::new(count);
    let stream = futures::stream::unfold(
        (state, None::<u64>, count),
        |(mut state, last, count)| async move {
            loop {
                let now = count(&index(&state));
                if last != Some(now) {
                    let event = SseEvent::default().data(now.to_string());
                    return Some((Ok(event), (state, Some(now), count)));
                }
                state.changes.changed().await.ok()?;
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn live_all(State(state): State<ViewState>) -> impl IntoResponse {
    changes(state, |index| index.generation())
}

async fn live_run(State(state): State<ViewState>, Path(run): Path<String>) -> impl IntoResponse {
    changes(state, move |index| index.run_events(&run) as u64)
}
