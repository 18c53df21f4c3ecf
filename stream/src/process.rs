//! What every forgelog process shares: where its local state lives, which
//! brokers it talks to by default, and how it is asked to stop.

use std::path::PathBuf;

/// The local broker's address, the default of every `--brokers`.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// `FORGELOG_BROKERS`, else [`DEFAULT_BROKERS`].
pub fn default_brokers() -> String {
    std::env::var("FORGELOG_BROKERS").unwrap_or_else(|_| DEFAULT_BROKERS.to_string())
}

/// Where forgelog keeps what it installs and caches per machine (the broker,
/// the default model, the test venv): `$FORGELOG_HOME`, else
/// `~/.cache/forgelog`.
pub fn forgelog_home() -> PathBuf {
    if let Some(home) = std::env::var_os("FORGELOG_HOME") {
        return PathBuf::from(home);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache/forgelog")
}

/// Where the default model is installed (`scripts/fetch-model.sh`): `models/`
/// under [`forgelog_home`].
pub fn models_dir() -> PathBuf {
    forgelog_home().join("models")
}

/// Installs the Ctrl-C and SIGTERM (how Kubernetes stops a pod) handlers now;
/// the future resolves on either. Installing first means a signal that arrives
/// while the process is still starting is not lost.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
