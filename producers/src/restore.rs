//! A restarted proxy takes over the sessions its predecessor left open.

use crate::server::ProxyState;
use crate::sessions;
use forgelog_stream::StreamConfig;
use std::sync::Arc;
use std::time::Duration;

/// Takes over the sessions the log says are open (a restarted proxy serves
/// the harnesses that were mid-rollout) and records the calls the previous
/// process left without an end as interrupted. First the spool is flushed, so
/// that the log holds everything that process recorded; if the broker cannot
/// be read the proxy starts with no sessions, saying so.
///
/// Only sessions of the proxy's own `--run` are taken over (the broker is
/// shared: other proxies serve other runs), and of those, with `--replicas`,
/// only the ones this replica owns. One proxy holds a session at a time: a
/// second live one would see the first one's calls as interrupted.
pub(crate) async fn restore_sessions(state: &Arc<ProxyState>, stream: &StreamConfig) {
    let Some(run) = state.config.run_id.clone() else {
        return;
    };
    let flushed = match &state.events {
        Some(events) => events.flush(Duration::from_secs(30)).await.is_ok(),
        None => true,
    };
    let stream = stream.clone();
    let read = tokio::task::spawn_blocking(move || {
        use forgelog_schemas::Topic;
        use forgelog_stream::LogReader;
        let reader = forgelog_stream::ReplayReader::new(&stream)?;
        let mut log = sessions::SessionLog::default();
        for e in &reader.run_events(&run, &[Topic::Rollouts, Topic::Rewards])? {
            log.apply(e);
        }
        if let Some(oldest) = log.oldest_open_ms() {
            // Their calls come after them (a minute's slack for clocks).
            let from = forgelog_stream::StartAt::Timestamp(oldest - 60_000);
            reader.for_each(Topic::Calls.name(), from, Some(&run), |r| {
                if let Ok(e) = &r.event {
                    log.apply(e);
                }
                std::ops::ControlFlow::Continue(())
            })?;
        }
        Ok::<_, forgelog_stream::ConsumeError>(log)
    })
    .await;
    let log = match read {
        Ok(Ok(log)) => log,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "open sessions of an earlier proxy not restored: the log cannot be read");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "open sessions of an earlier proxy not restored");
            return;
        }
    };
    let restored = state
        .sessions
        .restore(&log, state.config.max_calls_in_flight);
    let mut interrupted = 0;
    if flushed {
        for (session_id, index) in log.unfinished_calls() {
            if let Some(session) = state.sessions.by_id(&session_id) {
                state.record_interrupted(
                    &session,
                    index,
                    "interrupted: the proxy restarted with the call in flight",
                    Duration::ZERO,
                );
                interrupted += 1;
            }
        }
    }
    if !restored.is_empty() {
        tracing::info!(
            sessions = restored.len(),
            interrupted,
            "took over the open sessions of an earlier proxy"
        );
        eprintln!(
            "forgelog proxy: took over {} open sessions from the log ({interrupted} calls in flight when it stopped recorded as interrupted)",
            restored.len()
        );
    }
}
