//! Prometheus metrics for every forgelog process: one recorder per process,
//! every metric described once here (so `/metrics` has a `# HELP` line for
//! each), latencies as histograms (they aggregate across replicas, which
//! summaries do not), and `forgelog_build_info`. The proxy and the engine
//! serve [`render`] on their own `/metrics`; processes without an HTTP port
//! (consumers, trainer) get one from [`serve`].

use crate::{HttpOptions, HttpServer};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::sync::OnceLock;

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric a forgelog process records, with what it counts.
const METRICS: &[(&str, Kind, &str)] = &[
    ("forgelog_build_info", Kind::Gauge, "Always 1; the version label says which forgelog this is"),
    // capture proxy
    ("forgelog_proxy_calls_total", Kind::Counter, "Model calls answered, by dialect and status (ok, client_error, upstream_error, budget_stop)"),
    ("forgelog_proxy_upstream_seconds", Kind::Histogram, "Time the inference engine took to answer a call"),
    ("forgelog_proxy_prompt_tokens_total", Kind::Counter, "Prompt tokens of the calls answered, by dialect"),
    ("forgelog_proxy_completion_tokens_total", Kind::Counter, "Sampled tokens of the calls answered, by dialect"),
    ("forgelog_proxy_sessions", Kind::Gauge, "Sessions the proxy holds open"),
    ("forgelog_proxy_events_refused_total", Kind::Counter, "Calls refused because their events could not be recorded"),
    ("forgelog_proxy_unparsed_tool_calls_total", Kind::Counter, "Tool-call texts the proxy could not parse and passed on as text"),
    ("forgelog_proxy_prompts_total", Kind::Counter, "Prompts the proxy made itself (token in), by how: spliced onto an earlier call's ids, or rendered afresh"),
    ("forgelog_proxy_token_counts_total", Kind::Counter, "count_tokens requests answered"),
    ("forgelog_proxy_version_unknown_total", Kind::Counter, "Calls to an engine that says its version at /weight_info (vLLM) during which the version changed: sampled by either, recorded without one"),
    ("forgelog_replay_refused_total", Kind::Counter, "Calls replay serve refused because they differ from the recording"),
    // engine
    ("forgelog_engine_requests_total", Kind::Counter, "Generations finished, by finish reason"),
    ("forgelog_engine_prompt_tokens_total", Kind::Counter, "Prompt tokens prefilled"),
    ("forgelog_engine_generation_tokens_total", Kind::Counter, "Tokens sampled"),
    ("forgelog_engine_time_to_first_token_seconds", Kind::Histogram, "From a request's arrival to its first sampled token"),
    ("forgelog_engine_request_seconds", Kind::Histogram, "From a request's arrival to its last sampled token"),
    ("forgelog_engine_step_seconds", Kind::Histogram, "One scheduler step, by phase: schedule, forward (the model on its device), sample (logits to the host, sampling, replies)"),
    ("forgelog_engine_running", Kind::Gauge, "Sequences being generated now"),
    ("forgelog_engine_policy_version", Kind::Gauge, "The policy version the engine serves"),
    // engine sync
    ("forgelog_sync_seconds", Kind::Histogram, "Time one sync took to make the engine serve a published version, read back"),
    ("forgelog_sync_served_version", Kind::Gauge, "The version the synced engine serves, as it says"),
    // log producer and spool
    ("forgelog_events_sent_total", Kind::Counter, "Events handed to the log, by topic"),
    ("forgelog_events_delivered_total", Kind::Counter, "Events the broker acknowledged"),
    ("forgelog_events_too_large_total", Kind::Counter, "Events refused for their size"),
    ("forgelog_spool_bytes", Kind::Gauge, "Bytes waiting in the local spool"),
    ("forgelog_spool_full_total", Kind::Counter, "Events refused because the spool was full"),
    ("forgelog_spool_parked_total", Kind::Counter, "Records the broker refused for good, set aside"),
    ("forgelog_spool_drain_errors_total", Kind::Counter, "Errors sending spooled events (retried)"),
    // consumers
    ("forgelog_consumer_restarts_total", Kind::Counter, "Consumer loops restarted after an error"),
    ("forgelog_consumer_undecodable_total", Kind::Counter, "Messages a consumer could not decode (dead-lettered), by topic"),
    // trainer
    ("forgelog_trainer_steps_total", Kind::Counter, "Optimizer steps taken"),
    ("forgelog_trainer_step_seconds", Kind::Histogram, "Time one training step took"),
    ("forgelog_trainer_loss", Kind::Gauge, "Loss of the last step"),
    ("forgelog_trainer_tokens_total", Kind::Counter, "Sampled tokens trained on"),
    ("forgelog_trainer_policy_version", Kind::Gauge, "The last policy version published"),
];

/// Latency buckets (seconds), from a proxy's sub-millisecond work to a long generation.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];

/// The process's recorder, installed on first use. Another recorder may be
/// installed already (an embedding program's): then ours only renders.
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .expect("buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_ok() {
                describe();
            }
            handle
        })
        .clone()
}

fn describe() {
    for &(name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
    metrics::gauge!("forgelog_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// The exposition text of every metric recorded so far.
pub fn render() -> String {
    recorder().render()
}

/// `GET /metrics` for a router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/metrics", get(|| async { render() }))
}

/// A port with only `/metrics` (and `/health`), for processes that serve nothing else.
pub async fn serve(addr: SocketAddr) -> std::io::Result<HttpServer> {
    recorder();
    let listener = crate::listen(addr).await?;
    let router = routes().route("/health", get(|| async { "" }));
    HttpServer::start(listener, router, HttpOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric rendered has its help line, latencies come as histograms,
    /// and the build is labelled.
    #[test]
    fn every_metric_is_described_and_latencies_are_histograms() {
        recorder();
        metrics::counter!("forgelog_proxy_calls_total", "dialect" => "openai_chat", "status" => "ok").increment(1);
        metrics::histogram!("forgelog_proxy_upstream_seconds").record(0.02);
        metrics::histogram!("forgelog_engine_time_to_first_token_seconds").record(0.3);
        let text = render();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split_whitespace().nth(2).unwrap();
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "no help for {name}:\n{text}"
            );
        }
        assert!(
            text.contains("# TYPE forgelog_proxy_upstream_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("forgelog_proxy_upstream_seconds_bucket{le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("forgelog_engine_time_to_first_token_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "forgelog_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }

    #[test]
    fn metric_names_are_unique_and_prometheus_shaped() {
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
        names.sort();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "a metric described twice");
        for (name, kind, _) in METRICS {
            assert!(name.starts_with("forgelog_"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            if matches!(kind, Kind::Counter) {
                assert!(
                    name.ends_with("_total"),
                    "counter {name} must end in _total"
                );
            }
        }
    }
}
