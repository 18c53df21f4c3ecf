//! One run's processes in this process, as `up`, `up --demo`, `run` and
//! `run --train` start them: what answers its calls ([`Serving`]) and what
//! learns from them ([`Learning`]), the admission a training run's groups
//! wait on, what stops it early, its last versions, and the stop in order.

use crate::{LastVersions, Learning, LogClock, ServedClock, Serving, ServingConfig, StackError};
use forgelog_consumers::RewardConfig;
use forgelog_deploy::orchestrator::Admission;
use forgelog_deploy_core::StalenessBound;
use forgelog_stream::StreamConfig;
use forgelog_sync::{EngineSync, Kind, Mode, SyncArgs};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The consumers of a run and, when training, its learner.
#[derive(Debug, Clone)]
pub struct LearningConfig {
    /// The consumers' checkpoints.
    pub state: PathBuf,
    pub rewards: RewardConfig,
    pub train: Option<forgelog_trainer::TrainArgs>,
}

/// A run's engine and proxy and, when asked, its consumers and learner,
/// running until [`RunStack::stop`].
pub struct RunStack {
    pub run: String,
    pub serving: Serving,
    pub learning: Option<Learning>,
    /// How the engine's version is read back (a sync's kind and mode).
    synced: Option<(Kind, Mode)>,
    /// The learner's groups per step and staleness, when it steps on groups.
    bound: Option<StalenessBound>,
}

impl RunStack {
    /// Serves the run's calls, then starts its learning.
    pub async fn start(
        config: &StreamConfig,
        serving: ServingConfig,
        learning: Option<LearningConfig>,
    ) -> Result<RunStack, StackError> {
        let (run, synced) = (serving.run.clone(), serving.synced);
        let serving = Serving::start(config, serving).await?;
        let bound = learning
            .as_ref()
            .and_then(|l| l.train.as_ref())
            .and_then(|t| {
                Some(StalenessBound {
                    groups_per_step: t.groups_per_step?.max(1),
                    max_staleness: t.max_staleness,
                })
            });
        let learning =
            learning.map(|l| Learning::start(config, &run, &l.state, l.rewards, l.train));
        Ok(RunStack {
            run,
            serving,
            learning,
            synced,
            bound,
        })
    }

    /// The proxy's address, as sandboxes are pointed at it.
    pub fn proxy_addr(&self) -> Result<SocketAddr, StackError> {
        proxy_addr(&self.serving.proxy.url())
    }

    /// Reads the version the engine serves, in its own word: vLLM's (and
    /// forgelog's engine's) `/weight_info`, or the newest adapter it lists.
    pub fn reader(&self) -> EngineSync {
        engine_reader(&self.serving.upstream, self.synced)
    }

    /// A training run's admission: groups start under the learner's
    /// staleness bound, on the version the engine serves. None without a
    /// learner stepping on groups.
    pub fn admission(&self) -> Option<Admission> {
        let (bound, learning) = (self.bound?, self.learning.as_ref()?);
        Some(Admission {
            bound,
            clock: Box::new(ServedClock {
                engine: self.reader(),
                learner: learning.learner_end.clone(),
            }),
        })
    }

    /// What stops a run's rollouts early: `signal`, or the engine's sync
    /// ending (nothing more may be sampled by a version it did not load).
    pub async fn stopped(&mut self, signal: impl Future<Output = ()>) -> StackError {
        crate::stopped(&self.run, signal, &mut self.serving.sync).await
    }

    /// What stops a loop that waits for versions (`up --demo --train`): the
    /// engine's sync ending, or the learner failing (it publishes no more).
    pub async fn ended(&mut self) -> StackError {
        let learner = self.learning.as_ref().map(|l| l.learner_end.clone());
        let failed = async {
            match learner {
                Some(learner) => learner.failed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            why = crate::ended(&mut self.serving.sync) => StackError::SyncEnded(why),
            why = failed => StackError::LearnerFailed(why),
        }
    }

    /// After a training run's `groups`: its last versions, once the learner
    /// has them, and the engine serving the newest (see
    /// [`last_versions`](crate::last_versions)); None without a learner
    /// stepping on groups.
    pub async fn last_versions(
        &mut self,
        config: &StreamConfig,
        groups: usize,
        patience: Duration,
    ) -> Result<Option<LastVersions>, StackError> {
        let (Some(bound), Some(learning)) = (self.bound, &self.learning) else {
            return Ok(None);
        };
        let clock = LogClock {
            config: config.clone(),
            run: self.run.clone(),
        };
        let steps = groups.div_ceil(bound.groups_per_step) as u64;
        // Only a sync's engine is asked: forgelog's engine follows the log.
        let engine = self.serving.sync.as_ref().map(|_| self.reader());
        let learner = &learning.learner_end;
        let sync = &mut self.serving.sync;
        crate::last_versions(&clock, steps, learner, engine.as_ref(), sync, patience)
            .await
            .map(Some)
    }

    /// The proxy's events flushed (for up to `flush`) and the proxy
    /// stopped, then the learning (the consumers checkpoint), then the engine.
    pub async fn stop(self, flush: Duration) -> Result<(), StackError> {
        self.serving.stop(self.learning, flush).await
    }
}

/// Reads what the engine at `url` serves, as a sync (`synced`) reads it
/// back; forgelog's engine says its version at `/weight_info`, as vLLM does.
pub fn engine_reader(url: &str, synced: Option<(Kind, Mode)>) -> EngineSync {
    let (kind, mode) = synced.unwrap_or((Kind::Vllm, Mode::Weights));
    EngineSync::new(SyncArgs {
        step_timeout: 10,
        ..SyncArgs::new(url, kind, mode)
    })
}

/// The socket address of a proxy's `http://host[:port]` URL: sandboxes'
/// harnesses speak plain HTTP to it there (their network lets only it through).
pub fn proxy_addr(url: &str) -> Result<SocketAddr, StackError> {
    let bad = |why: String| StackError::Proxy(format!("its address in {url}: {why}"));
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    if parsed.scheme() != "http" {
        return Err(bad(format!(
            "sandboxes speak plain http:// to the proxy, not {}://",
            parsed.scheme()
        )));
    }
    parsed
        .socket_addrs(|| Some(80))
        .map_err(|e| bad(e.to_string()))?
        .into_iter()
        .next()
        .ok_or_else(|| bad("no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_url_is_its_socket_address_or_a_clear_error() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            proxy_addr("http://127.0.0.1:8100/").unwrap(),
            addr("127.0.0.1:8100")
        );
        assert_eq!(proxy_addr("http://[::1]:8100").unwrap(), addr("[::1]:8100"));
        // Found by probing `run --proxy`: a URL without a port was "invalid
        // socket address", an https:// one "failed to lookup address".
        assert_eq!(
            proxy_addr("http://127.0.0.1").unwrap(),
            addr("127.0.0.1:80")
        );
        let err = proxy_addr("https://127.0.0.1:8100")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the capture proxy: its address in https://127.0.0.1:8100: sandboxes speak plain http:// to the proxy, not https://"
        );
        let err = proxy_addr("127.0.0.1:8100").unwrap_err().to_string();
        assert!(
            err.starts_with("the capture proxy: its address in 127.0.0.1:8100: "),
            "{err}"
        );
    }
}
