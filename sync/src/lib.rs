//! `forgelog sync`: follows `forgelog.policy` and makes an inference engine
//! serve each version the learner publishes, by the plan of
//! [`forgelog_sync_core`] for its kind (vLLM, SGLang, forgelog's engine).
//! Every request has a deadline; a refused or timed-out step is an error
//! naming the engine, the route and the answer. A step that fails once the
//! engine is paused leaves it paused (vLLM does not roll back a half-done
//! reload: nothing is sampled by such weights), and the next sync reloads
//! the newest version into it. The version served is the engine's own
//! answer, read back after every sync.

mod follow;
mod stage;

pub use follow::{follow, follow_from, run};
pub use forgelog_sync_core::{adapter_name, EngineKind as Kind, ModelList, SyncMode as Mode};

use forgelog_schemas::PolicyPublished;
use forgelog_sync_core::{self as core, EngineKind, Method, Step, SyncMode};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{engine} {route}: no answer within {secs} s")]
    Timeout {
        engine: String,
        route: String,
        secs: u64,
    },
    #[error("{engine} {route}: {why}")]
    Unreachable {
        engine: String,
        route: String,
        why: String,
    },
    #[error("{engine} {route} refused (HTTP {status}): {answer}")]
    Refused {
        engine: String,
        route: String,
        status: u16,
        answer: String,
    },
    #[error("{engine} serves version {served:?} after loading version {loaded}")]
    OtherVersion {
        engine: String,
        loaded: u64,
        served: Option<u64>,
    },
    #[error("staging version {version} from {uri}: {why}")]
    Stage {
        version: u64,
        uri: String,
        why: String,
    },
    #[error(
        "{cause}; {engine} is left paused: a failed reload may have loaded part of the \
         weights, so nothing is sampled by them. Restart forgelog sync once a loadable \
         version is published (it reloads the newest into a paused engine and resumes it), \
         or restart the engine"
    )]
    LeftPaused {
        engine: String,
        cause: Box<SyncError>,
    },
    #[error(
        "{engine} is paused (a failed sync leaves it so) and this run has published no \
         version to load into it: restart the engine"
    )]
    PausedWithNothingToLoad { engine: String },
    #[error("reading forgelog.policy: {0}")]
    Log(#[from] forgelog_stream::ConsumeError),
}

/// What `forgelog sync` keeps in sync, and how.
#[derive(Debug, Clone, clap::Args)]
pub struct SyncArgs {
    /// The engine's base URL (http://host:port)
    #[arg(long, env = "FORGELOG_UPSTREAM", value_parser = forgelog_http::http_url_arg)]
    pub upstream: String,
    /// What kind of engine it is
    #[arg(long, value_enum, default_value_t = EngineKind::Vllm)]
    pub engine: EngineKind,
    /// Whether a published version is full weights or a LoRA adapter
    #[arg(long, value_enum, default_value_t = SyncMode::Weights)]
    pub sync_mode: SyncMode,
    /// Where each version's model folder is put together for the engine to
    /// load (links to a local checkpoint's weights, copies of a remote one's):
    /// a directory the engine can read [default: FORGELOG_HOME/staged-checkpoints]
    #[arg(long)]
    pub stage_dir: Option<PathBuf>,
    /// Seconds a step may take (a reload of a large model takes a while)
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub step_timeout: u64,
    /// Adapters this many versions older than the served one stay loaded
    #[arg(long, default_value_t = 1)]
    pub staleness: u64,
    /// The engine's API key, when it asks for one
    #[arg(long, env = "FORGELOG_UPSTREAM_API_KEY")]
    pub api_key: Option<String>,
    /// Only this run's versions (default: every run's)
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: Option<String>,
}

impl SyncArgs {
    /// `forgelog sync`'s defaults for an engine of `kind` at `upstream`.
    pub fn new(upstream: &str, engine: EngineKind, sync_mode: SyncMode) -> SyncArgs {
        SyncArgs {
            upstream: upstream.to_string(),
            engine,
            sync_mode,
            stage_dir: None,
            step_timeout: 600,
            staleness: 1,
            api_key: None,
            run: None,
        }
    }
}

/// One engine kept in sync.
pub struct EngineSync {
    args: SyncArgs,
    http: reqwest::Client,
    /// Whether the [`core::reload_caveat`] was said (once a process).
    warned: AtomicBool,
    times: SyncTimes,
}

/// How long each version took to serve (staged, loaded, read back from the
/// engine), for whoever reports the run; shared with the sync's task.
#[derive(Debug, Clone)]
pub struct SyncTimes {
    /// `vllm, adapter`: the engine and how it is synced.
    kind: String,
    took: std::sync::Arc<std::sync::Mutex<Vec<Duration>>>,
}

impl SyncTimes {
    fn record(&self, took: Duration) {
        self.took
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(took);
    }

    /// `sync per version (vllm, adapter): mean A s, max B s over N
    /// versions`; `None` before the first.
    pub fn summary(&self) -> Option<String> {
        let took = self.took.lock().unwrap_or_else(|p| p.into_inner());
        let max = took.iter().max()?.as_secs_f64();
        let mean = took.iter().sum::<Duration>().as_secs_f64() / took.len() as f64;
        Some(format!(
            "sync per version ({}): mean {mean:.2} s, max {max:.2} s over {} versions",
            self.kind,
            took.len()
        ))
    }
}

impl EngineSync {
    pub fn new(args: SyncArgs) -> EngineSync {
        EngineSync {
            http: reqwest::Client::new(),
            warned: AtomicBool::new(false),
            times: SyncTimes {
                kind: format!("{:?}, {:?}", args.engine, args.sync_mode).to_lowercase(),
                took: Default::default(),
            },
            args,
        }
    }

    /// The time each version took to serve, as the sync goes.
    pub fn times(&self) -> SyncTimes {
        self.times.clone()
    }

    fn engine(&self) -> String {
        format!("{:?} at {}", self.args.engine, self.args.upstream).to_lowercase()
    }

    /// Sends one step; its JSON answer (`Null` for a plain-text one).
    async fn send(&self, step: &Step) -> Result<serde_json::Value, SyncError> {
        let url = format!("{}{}", self.args.upstream.trim_end_matches('/'), step.path);
        let route = step.path.clone();
        let secs = self.args.step_timeout;
        let ask = || {
            let mut request = match step.method {
                Method::Get => self.http.get(&url),
                Method::Post => self.http.post(&url),
            };
            if let Some(body) = &step.body {
                request = request.json(body);
            }
            if let Some(key) = &self.args.api_key {
                request = request.bearer_auth(key);
            }
            tokio::time::timeout(Duration::from_secs(secs), async {
                let r = request.send().await?;
                let status = r.status().as_u16();
                Ok::<_, reqwest::Error>((status, r.text().await?))
            })
        };
        let mut answer = ask().await;
        // Every step is idempotent, so one that never reached the engine is
        // sent again once: vLLM closes a connection after a 500, and the
        // pooled one the next step (the resume after a refused reload) takes
        // is dead (found by tests/vllm/).
        if matches!(&answer, Ok(Err(e)) if e.is_request() || e.is_connect()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            answer = ask().await;
        }
        let (status, text) = match answer {
            Err(_) => {
                return Err(SyncError::Timeout {
                    engine: self.engine(),
                    route,
                    secs,
                })
            }
            Ok(Err(e)) => {
                return Err(SyncError::Unreachable {
                    engine: self.engine(),
                    route,
                    why: e.to_string(),
                })
            }
            Ok(Ok(answer)) => answer,
        };
        tracing::debug!(engine = %self.engine(), route = %step.path, status, "sync step");
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if !core::accepted(status, &body) {
            return Err(SyncError::Refused {
                engine: self.engine(),
                route,
                status,
                answer: text.chars().take(500).collect(),
            });
        }
        Ok(body)
    }

    /// The version the engine says it serves.
    pub async fn served(&self) -> Result<Option<u64>, SyncError> {
        let read_back = core::plan(self.args.engine, self.args.sync_mode, 0, "").read_back;
        let body = self.send(&read_back).await?;
        Ok(core::served_version(
            self.args.engine,
            self.args.sync_mode,
            &body,
        ))
    }

    /// Makes the engine serve `published` and reads the version back; the
    /// time it took.
    pub async fn serve(&self, published: &PolicyPublished) -> Result<Duration, SyncError> {
        let started = Instant::now();
        let version = published.version.max(0) as u64;
        let dir = self.stage(published).await?;
        let plan = core::plan(
            self.args.engine,
            self.args.sync_mode,
            version,
            &dir.display().to_string(),
        );
        if !self.warned.load(Ordering::Relaxed) {
            if let Ok(config) = std::fs::read(dir.join("config.json")) {
                let config = serde_json::from_slice(&config).unwrap_or_default();
                let caveat = core::reload_caveat(self.args.engine, self.args.sync_mode, &config);
                if let Some(why) = caveat {
                    self.warned.store(true, Ordering::Relaxed);
                    tracing::warn!(engine = %self.engine(), "not served exactly as trained: {why}");
                }
            }
        }
        let mut paused = false;
        let done = async {
            for step in &plan.steps {
                self.send(step).await?;
                paused |= step.pauses;
            }
            Ok(())
        }
        .await;
        match done {
            // Once paused, the engine stays paused on a failure: vLLM does
            // not roll back what a failed reload loaded.
            Err(cause) if paused => {
                return Err(SyncError::LeftPaused {
                    engine: self.engine(),
                    cause: Box::new(cause),
                })
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        if let Some(resume) = &plan.resume {
            self.send(resume).await?;
        }
        let answer = self.send(&plan.read_back).await?;
        let served = core::served_version(self.args.engine, self.args.sync_mode, &answer);
        if served != Some(version) {
            return Err(SyncError::OtherVersion {
                engine: self.engine(),
                loaded: version,
                served,
            });
        }
        if self.args.sync_mode == SyncMode::Adapter {
            let listed = core::ModelList::of(&answer).unwrap_or_default();
            for old in listed.stale_adapters(version, self.args.staleness) {
                self.send(&core::unload_adapter(self.args.engine, old))
                    .await?;
            }
        }
        let took = started.elapsed();
        self.times.record(took);
        metrics::histogram!("forgelog_sync_seconds").record(took.as_secs_f64());
        metrics::gauge!("forgelog_sync_served_version").set(version as f64);
        Ok(took)
    }
}

impl EngineSync {
    /// What the engine serves as a sync starts, from its own word: a paused
    /// engine (left so by a failed sync: its weights are not the version it
    /// names) serves nothing, so the newest published version is loaded into
    /// it; an engine that names no version of ours is declared version 0
    /// (see [`forgelog_sync_core::declare_base`]).
    pub async fn start(&self) -> Result<Option<u64>, SyncError> {
        let served = self.served().await?;
        let paused = match core::paused_query(self.args.engine) {
            Some(query) => core::is_paused(&self.send(&query).await?),
            None => false,
        };
        if paused {
            return Ok(None);
        }
        if served.is_none() {
            if let Some(step) = core::declare_base(self.args.engine, self.args.sync_mode) {
                self.send(&step).await?;
                return Ok(Some(0));
            }
        }
        Ok(served)
    }
}

#[cfg(test)]
mod tests;
