//! The fake API server's HTTP face: the core and group paths `kube` uses
//! for namespaced objects (create, get, list, watch, replace, merge patch,
//! delete), `Status` errors, and injected failures (a run of 500s or 429s).

use crate::store::{merge_patch, Change, Refusal, Store};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// The kinds the fake serves, by their resource path.
fn kind_of(resource: &str) -> Option<(&'static str, &'static str)> {
    Some(match resource {
        "pods" => ("Pod", "v1"),
        "secrets" => ("Secret", "v1"),
        "configmaps" => ("ConfigMap", "v1"),
        "jobs" => ("Job", "batch/v1"),
        "networkpolicies" => ("NetworkPolicy", "networking.k8s.io/v1"),
        _ => return None,
    })
}

pub struct Server {
    pub store: Arc<Store>,
    /// Statuses the next requests get instead of an answer.
    pub faults: Mutex<VecDeque<u16>>,
    /// Requests served, faults included.
    pub requests: std::sync::atomic::AtomicU64,
}

fn status(r: Refusal) -> Response {
    let code = StatusCode::from_u16(r.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": r.message, "reason": r.reason, "code": r.code});
    (code, axum::Json(body)).into_response()
}

fn ok(object: Value) -> Response {
    axum::Json(object).into_response()
}

type Params = Query<HashMap<String, String>>;

async fn collection(
    State(s): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    Query(q): Params,
    method: axum::http::Method,
    body: Bytes,
) -> Response {
    if let Some(r) = s.fault() {
        return status(r);
    }
    let Some((kind, api_version)) = kind_of(&p["resource"]) else {
        return status(Refusal {
            code: 404,
            reason: "NotFound",
            message: format!("no resource {}", p["resource"]),
        });
    };
    let ns = p["ns"].clone();
    if method == axum::http::Method::POST {
        let object: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return status(Refusal {
                    code: 400,
                    reason: "BadRequest",
                    message: e.to_string(),
                })
            }
        };
        return match s.store.create(kind, &ns, object) {
            Ok(v) => (StatusCode::CREATED, axum::Json(v)).into_response(),
            Err(r) => status(r),
        };
    }
    let selector = q.get("labelSelector").map(String::as_str);
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (past, live) = s.store.watch(from);
        let (kind, ns, selector) = (kind.to_string(), ns.clone(), selector.map(str::to_string));
        let wanted = move |c: &Change| {
            c.kind == kind
                && c.namespace == ns
                && crate::store::matches(selector.as_deref(), &c.object["metadata"]["labels"])
        };
        let line = |c: Change| {
            let mut l =
                serde_json::to_vec(&json!({"type": c.what, "object": c.object})).expect("json");
            l.push(b'\n');
            Ok::<_, std::io::Error>(Bytes::from(l))
        };
        let wanted2 = wanted.clone();
        let past = futures::stream::iter(past.into_iter().filter(wanted));
        // A lagging watcher's stream ends; it watches again from its last version.
        let live = tokio_stream_from(live).filter(move |c| std::future::ready(wanted2(c)));
        return Body::from_stream(past.chain(live).map(line)).into_response();
    }
    let (items, rv) = s.store.list(kind, &ns, selector);
    ok(
        json!({"kind": format!("{kind}List"), "apiVersion": api_version,
        "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// The live changes, until the receiver lags or the store goes.
fn tokio_stream_from(
    rx: tokio::sync::broadcast::Receiver<Change>,
) -> impl futures::Stream<Item = Change> {
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.ok().map(|c| (c, rx)) },
    )
}

async fn object(
    State(s): State<Arc<Server>>,
    Path(p): Path<HashMap<String, String>>,
    method: axum::http::Method,
    body: Bytes,
) -> Response {
    if let Some(r) = s.fault() {
        return status(r);
    }
    let Some((kind, _)) = kind_of(&p["resource"]) else {
        return status(Refusal {
            code: 404,
            reason: "NotFound",
            message: format!("no resource {}", p["resource"]),
        });
    };
    let (ns, name) = (&p["ns"], &p["name"]);
    let parsed = || {
        serde_json::from_slice::<Value>(&body).map_err(|e| Refusal {
            code: 400,
            reason: "BadRequest",
            message: e.to_string(),
        })
    };
    let result = match method.as_str() {
        "GET" => s.store.get(kind, ns, name),
        "DELETE" => s.store.delete(kind, ns, name),
        "PUT" => parsed().and_then(|new| s.store.update(kind, ns, name, |o| *o = new)),
        "PATCH" => {
            parsed().and_then(|patch| s.store.update(kind, ns, name, |o| merge_patch(o, &patch)))
        }
        _ => Err(Refusal {
            code: 405,
            reason: "MethodNotAllowed",
            message: method.to_string(),
        }),
    };
    match result {
        Ok(v) => ok(v),
        Err(r) => status(r),
    }
}

impl Server {
    fn fault(&self) -> Option<Refusal> {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let code = self.faults.lock().expect("faults").pop_front()?;
        Some(Refusal {
            code,
            reason: if code == 429 {
                "TooManyRequests"
            } else {
                "InternalError"
            },
            message: "injected".into(),
        })
    }

    pub fn router(self: Arc<Self>) -> Router {
        let any = || get(collection).post(collection);
        let one = || get(object).put(object).patch(object).delete(object);
        Router::new()
            .route("/api/v1/namespaces/{ns}/{resource}", any())
            .route("/api/v1/namespaces/{ns}/{resource}/{name}", one())
            .route("/apis/{group}/{version}/namespaces/{ns}/{resource}", any())
            .route(
                "/apis/{group}/{version}/namespaces/{ns}/{resource}/{name}",
                one(),
            )
            .with_state(self)
    }
}
