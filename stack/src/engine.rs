//! `forgelog engine` in this process.

use crate::StackError;
use forgelog_engine::DeviceKind;
use forgelog_stream::StreamConfig;
use std::net::SocketAddr;
use std::time::Duration;

/// The embedded engine, serving until stopped.
pub struct LocalEngine {
    pub url: String,
    /// The engine stops (and lets go of the broker) when this is sent or dropped.
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl LocalEngine {
    /// Serves `model` on `listen` (port 0: any; the URL says which), loading
    /// the policies `run` publishes on `config`'s brokers (another run's
    /// versions are not this run's policy); returns once healthy.
    pub async fn start(
        model: &str,
        listen: SocketAddr,
        device: DeviceKind,
        config: &StreamConfig,
        run: &str,
    ) -> Result<LocalEngine, StackError> {
        let engine = forgelog_engine::EngineArgs {
            model: model.to_string(),
            listen,
            device,
            brokers: Some(config.brokers.clone()),
            run: Some(run.to_string()),
            // It follows forgelog.policy; reload over HTTP stays off.
            admin_token: None,
            checkpoint_root: None,
            max_checkpoint_mib: forgelog_engine::DEFAULT_MAX_CHECKPOINT_BYTES >> 20,
            prefix_cache_mib: forgelog_engine::DEFAULT_PREFIX_CACHE_MIB,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let listener = forgelog_http::listen(listen)
            .await
            .map_err(|e| StackError::Engine(e.to_string()))?;
        let url = format!("http://{}", listener.local_addr()?);
        let (failed, why) = tokio::sync::oneshot::channel::<String>();
        let mut task = tokio::spawn(async move {
            if let Err(e) = forgelog_engine::serve_on(listener, engine, shutdown).await {
                tracing::error!("engine stopped: {e}");
                let _ = failed.send(e.to_string());
            }
        });
        // An engine that cannot start (no such device, no model) ends its
        // task at once: say so then, not after the wait for its health.
        let health = format!("{url}/healthz");
        tokio::select! {
            healthy = wait_healthy(&health) => healthy?,
            _ = &mut task => {
                let why = why.await.unwrap_or_else(|_| "ended".into());
                return Err(StackError::Engine(format!("did not start: {why}")));
            }
        }
        Ok(LocalEngine { url, stop, task })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Until `url` answers 2xx, for two minutes at most.
async fn wait_healthy(url: &str) -> Result<(), StackError> {
    let client = reqwest::Client::new();
    for _ in 0..600 {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(StackError::Engine(format!(
        "did not become healthy at {url} within 2 minutes"
    )))
}
