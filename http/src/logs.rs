//! Every forgelog process's log lines: to stderr, at the level asked for or
//! as `RUST_LOG` says, coloured only for a person at a terminal.

use std::sync::atomic::{AtomicU64, Ordering};
use tracing_subscriber::prelude::*;

/// Logs at `level` (an `EnvFilter` directive), or as `RUST_LOG` says.
/// librdkafka repeats a failure once per reconnect attempt (hundreds of lines
/// while a broker is down): its lines pass at most once per 30 seconds.
pub fn init_logs(level: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    let start = std::time::Instant::now();
    let last_kafka_line = AtomicU64::new(u64::MAX);
    let kafka_once = tracing_subscriber::filter::filter_fn(move |meta| {
        if !meta.target().contains("rdkafka") {
            return true;
        }
        let now = start.elapsed().as_secs();
        let last = last_kafka_line.load(Ordering::Relaxed);
        if last != u64::MAX && now < last + 30 {
            return false;
        }
        last_kafka_line.store(now, Ordering::Relaxed);
        true
    });
    // Not in files, pipes or CI logs.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let output = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .with_filter(kafka_once);
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .init();
}
