//! Helpers for tests and benchmarks that run against a real broker.

use crate::broker::{find_tansu, BrokerError, LocalBroker};
use crate::{admin, StreamConfig};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

/// How much longer the kill, chaos and soak tests run than in CI: the
/// `FORGELOG_SOAK` multiplier (1 when unset; `scripts/test.sh --soak` sets 10).
pub fn soak_scale() -> usize {
    std::env::var("FORGELOG_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1)
}

/// A run id no other test run has used (tests share the broker's topics).
pub fn unique_run_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// The Python of the venv with the official SDKs (`scripts/python-env.sh`):
/// `$FORGELOG_HOME/venv` (default `~/.cache/forgelog`). Panics, naming the
/// script, when it is missing: tests that need it fail, they never skip.
pub fn venv_python() -> PathBuf {
    python_of("venv", "the SDKs", "scripts/python-env.sh")
}

/// The Python of the venv with torch, transformers and TRL
/// (`scripts/torch-env.sh`, which `scripts/test.sh` runs):
/// `$FORGELOG_HOME/venv-torch`. Panics, naming the script, when it is missing.
pub fn torch_venv_python() -> PathBuf {
    python_of("venv-torch", "torch and TRL", "scripts/torch-env.sh")
}

fn python_of(venv: &str, what: &str, script: &str) -> PathBuf {
    let python = crate::forgelog_home().join(venv).join("bin/python3");
    assert!(
        python.exists(),
        "the Python venv with {what} is missing at {}: run {script}",
        python.display()
    );
    python
}

/// Runs `script` with the SDK venv's Python and `args`; fails the test with its
/// output unless it succeeds; returns the last line it printed, parsed as JSON.
pub async fn python_json(script: &std::path::Path, args: &[&str]) -> serde_json::Value {
    python_json_with(&venv_python(), script, args).await
}

/// [`python_json`] with another Python ([`torch_venv_python`]).
pub async fn python_json_with(
    python: &std::path::Path,
    script: &std::path::Path,
    args: &[&str],
) -> serde_json::Value {
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{} printed no JSON ({e}):\n{stdout}", script.display()))
}

/// A loopback address nothing listens on right now.
pub fn free_local_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr")
}

/// The shared test broker (`FORGELOG_BROKERS`, else 127.0.0.1:9092), with the topics created.
pub async fn shared_broker() -> StreamConfig {
    let config = StreamConfig::new(crate::default_brokers());
    admin::create_topics(&config, &Default::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no broker at {} ({e}); start one with `forgelog broker` or .ci/run",
                config.brokers
            )
        });
    config
}

/// A broker of the test's own, which it may kill and restart.
pub struct PrivateBroker {
    pub binary: PathBuf,
    pub data: tempfile::TempDir,
    pub addr: SocketAddr,
    pub broker: Option<LocalBroker>,
}

impl PrivateBroker {
    pub fn start() -> Result<PrivateBroker, BrokerError> {
        let binary = find_tansu().ok_or_else(|| {
            BrokerError::NotInstalled(crate::broker::tools_root().display().to_string())
        })?;
        let data = tempfile::Builder::new()
            .prefix("forgelog-broker")
            .tempdir()
            .map_err(|source| BrokerError::DataDir {
                dir: std::env::temp_dir(),
                source,
            })?;
        let addr = free_local_addr();
        let broker = LocalBroker::start(&binary, data.path(), addr)?;
        Ok(PrivateBroker {
            binary,
            data,
            addr,
            broker: Some(broker),
        })
    }

    pub fn config(&self) -> StreamConfig {
        StreamConfig::new(self.addr.to_string())
    }

    /// `kill -9` the broker.
    pub fn kill(&mut self) {
        if let Some(b) = self.broker.take() {
            b.kill();
        }
    }

    /// Start it again on the same data and address.
    pub fn restart(&mut self) -> Result<(), BrokerError> {
        self.kill();
        self.broker = Some(LocalBroker::start(
            &self.binary,
            self.data.path(),
            self.addr,
        )?);
        Ok(())
    }
}

/// Creates the topics and writes `events` through a throwaway spool, waiting
/// until the broker has them all.
pub async fn produce(config: &StreamConfig, events: &[forgelog_schemas::Event]) {
    admin::create_topics(config, &Default::default())
        .await
        .expect("create topics");
    let spool = tempfile::tempdir().expect("temp dir");
    let p =
        crate::EventProducer::start(config, spool.path(), Default::default()).expect("producer");
    for e in events {
        p.send(e).expect("send");
    }
    p.close(std::time::Duration::from_secs(120))
        .await
        .expect("broker took the events");
}
