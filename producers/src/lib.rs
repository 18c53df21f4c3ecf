//! forgelog-producers: the capture proxy between unmodified harnesses and the
//! inference engine. The pure translation core is `forgelog-dialects`;
//! [`upstream`] reads and writes the vLLM-compatible engine API;
//! [`server`] is the thin axum shell that records every call through the
//! spool-backed [`forgelog_stream::EventProducer`].

mod args;
#[cfg(any(test, feature = "testing"))]
pub mod fake_upstream;
pub mod replay;
mod restore;
pub mod server;
pub mod sessions;
pub mod upstream;

pub use args::{ExtraBodyArg, ProxyArgs, ReplayServeArgs, ServeArgs};

use forgelog_stream::{EventProducer, SpoolOptions, StreamConfig};
use metrics_exporter_prometheus::PrometheusHandle;
use server::{ProxyConfig, ProxyState};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long the proxy's events wait to be batched for the broker. They are in
/// the spool before the harness gets its answer; the wait only delays when
/// the consumers see them. At about 1,200 calls a second against tansu
/// (`proxy-load`, 9,600 calls a run), the Kafka client's broker thread took
/// 0.72–1.14 s of CPU a run at 100 ms, spinning at the in-flight limit, and
/// 0.10–0.11 s at 300 ms.
const EVENT_LINGER: Duration = Duration::from_millis(300);

/// Reads run `run`'s sessions and calls from `forgelog.rollouts` and
/// `forgelog.calls`: of the log, or of the run's bundle when given.
pub async fn load_recording(
    stream: &StreamConfig,
    run: &str,
    bundle: Option<&std::path::Path>,
) -> Result<replay::Recording, ProxyError> {
    let (stream, run) = (stream.clone(), run.to_string());
    let bundle = bundle.map(std::path::Path::to_path_buf);
    tokio::task::spawn_blocking(move || {
        use forgelog_schemas::Topic;
        use forgelog_stream::LogReader;
        let topics = [Topic::Rollouts, Topic::Calls];
        let events = match bundle {
            None => forgelog_stream::ReplayReader::new(&stream)?.run_events(&run, &topics)?,
            Some(path) => {
                let bundle = forgelog_stream::Bundle::open(&path)?;
                if bundle.run() != run {
                    return Err(ProxyError::OtherRun {
                        bundle: path,
                        holds: bundle.run().to_string(),
                        run,
                    });
                }
                bundle.run_events(&run, &topics)?
            }
        };
        let recording = replay::Recording::from_events(&run, &events);
        if recording.sessions.is_empty() {
            return Err(ProxyError::EmptyRecording(run));
        }
        Ok(recording)
    })
    .await
    .map_err(|e| ProxyError::Serve(std::io::Error::other(e)))?
}

/// `forgelog replay serve`: answers from the recording until Ctrl-C or SIGTERM.
pub async fn run_replay(args: ReplayServeArgs) -> Result<(), ProxyError> {
    let stop = forgelog_stream::shutdown_signal().map_err(ProxyError::Serve)?;
    let stream = StreamConfig::new(&args.serve.brokers);
    let recording = load_recording(&stream, &args.run, args.bundle.as_deref()).await?;
    let (sessions, calls) = (
        recording.sessions.len(),
        recording
            .sessions
            .values()
            .map(|s| s.calls.len())
            .sum::<usize>(),
    );
    let config = args.config();
    let matching = if args.lenient {
        let normaliser = replay::Normaliser::with_volatile(&args.volatile)
            .map_err(|e| ProxyError::Volatile(e.to_string()))?;
        replay::Matching::Lenient(normaliser)
    } else {
        replay::Matching::Strict
    };
    let recorded = Arc::new(replay::RecordedUpstream::new(recording, matching));
    let proxy =
        RunningProxy::replay_from(config.clone(), recorded.clone(), args.serve.listen).await?;
    print_admin_token(&args.serve, &config);
    eprintln!(
        "forgelog replay serve on {}: run {} ({sessions} sessions, {calls} calls), nothing recorded\n\
         start a replay session with POST /sessions {{\"replay_of\": \"<session or rollout id>\"}} \
         (or the original session request); each call is answered by the recorded call it asks the same as",
        proxy.url(),
        args.run
    );
    stop.await;
    let stopped = proxy.shutdown(Duration::from_secs(1)).await;
    let report = recorded.report();
    eprint!("{}", replay::report_text(&report));
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).expect("the report serializes");
        std::fs::write(path, json).map_err(ProxyError::Serve)?;
    }
    stopped
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("token in: {0}")]
    Rendering(String),
    #[error("--replicas: {0}")]
    Replicas(String),
    #[error("--volatile: {0}")]
    Volatile(String),
    #[error("reading the recording: {0}")]
    Log(#[from] forgelog_stream::ConsumeError),
    #[error("run {0} has no recorded sessions in forgelog.rollouts")]
    EmptyRecording(String),
    #[error(transparent)]
    Bundle(#[from] forgelog_stream::BundleError),
    #[error("{} holds run {holds}, not {run}", bundle.display())]
    OtherRun {
        bundle: PathBuf,
        holds: String,
        run: String,
    },
    #[error("spool: {0}")]
    Spool(#[from] forgelog_stream::SpoolError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Flush(#[from] forgelog_stream::FlushTimeout),
}

/// The process-wide Prometheus recorder (installed once; tests start many proxies).
pub fn metrics_handle() -> PrometheusHandle {
    forgelog_http::telemetry::recorder()
}

/// Binds with a deep accept backlog: thousands of harnesses may connect at once.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(16384)
}

/// Raises this process's open-file limit to its hard limit (one fd per connection).
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    lim.rlim_cur
}

/// A proxy serving in this process (the CLI, tests, the load bench).
pub struct RunningProxy {
    pub addr: SocketAddr,
    pub state: Arc<ProxyState>,
    /// The spool-backed producer the proxy records through, closed on shutdown.
    spool: Option<Arc<EventProducer>>,
    server: forgelog_http::HttpServer,
}

impl RunningProxy {
    /// Records (key and value) larger than this go to the claim store: the
    /// flag, or lower where the broker says so. `None`: recording nothing.
    pub fn max_record_bytes(&self) -> Option<usize> {
        Some(self.spool.as_ref()?.claims().max_record_bytes())
    }

    /// Probes the upstream, opens the spool, binds `listen` and serves.
    pub async fn start(
        config: ProxyConfig,
        stream: &StreamConfig,
        spool: PathBuf,
        listen: SocketAddr,
    ) -> Result<RunningProxy, ProxyError> {
        let client = upstream::UpstreamClient::new(&config.upstream, Duration::from_secs(30), 1);
        let probe = match client.probe().await {
            Ok(p) => {
                if p.untrainable.is_none() {
                    tracing::info!(model = %p.model, "upstream returns token ids and logprobs: calls are trainable");
                }
                p
            }
            Err(e) => upstream::Probe {
                untrainable: Some(format!("probe failed: {e}")),
                ..Default::default()
            },
        };
        if let Some(token_in) = &config.token_in {
            if probe.model.is_empty() {
                tracing::warn!("upstream down at start: the proxy's rendering is not checked against the engine's /tokenize");
            } else {
                upstream::check_rendering(&client, token_in)
                    .await
                    .map_err(ProxyError::Rendering)?;
                tracing::info!(tokenizer = %token_in.tokenizer_sha256, template = %token_in.chat_template_sha256,
                    "token in: the proxy renders prompts as the engine does");
            }
        }
        let warning = probe.untrainable.clone();
        if let Some(w) = &warning {
            let line = "!".repeat(78);
            eprintln!("{line}\nforgelog proxy: upstream {} is NOT TRAINABLE as probed: {w}\ncalls are served and recorded with trainable=false and the reason\n{line}", config.upstream);
            tracing::warn!(upstream = %config.upstream, reason = %w, "upstream not trainable");
        }
        let stream = forgelog_stream::admin::within_broker_ceiling(stream).await;
        let producer = Arc::new(EventProducer::start(
            &stream,
            spool,
            SpoolOptions {
                linger: EVENT_LINGER,
                ..SpoolOptions::default()
            },
        )?);
        let claims = producer.claims();
        tracing::info!(max_record_bytes = claims.max_record_bytes(), claims = %claims.url(),
            "events larger than a record go to the claim store");
        let state = Arc::new(ProxyState::new(config, producer.clone(), probe));
        restore::restore_sessions(&state, &stream).await;
        let mut proxy = RunningProxy::serve(state, listen).await?;
        proxy.spool = Some(producer);
        Ok(proxy)
    }

    /// `replay serve`: the proxy with `recording` as its upstream, recording nothing.
    pub async fn replay(
        config: ProxyConfig,
        recording: replay::Recording,
        listen: SocketAddr,
    ) -> Result<RunningProxy, ProxyError> {
        let recorded = replay::RecordedUpstream::new(recording, Default::default());
        RunningProxy::replay_from(config, Arc::new(recorded), listen).await
    }

    /// [`RunningProxy::replay`] with the matching and report of `recorded`.
    pub async fn replay_from(
        config: ProxyConfig,
        recorded: Arc<replay::RecordedUpstream>,
        listen: SocketAddr,
    ) -> Result<RunningProxy, ProxyError> {
        let probe = upstream::Probe {
            model: recorded.recording.model.clone(),
            ..Default::default()
        };
        let upstream = upstream::Upstream::Recorded(recorded);
        let state = Arc::new(ProxyState::with_upstream(config, upstream, None, probe));
        RunningProxy::serve(state, listen).await
    }

    /// Binds `listen` and serves `state`'s routes.
    pub async fn serve(
        state: Arc<ProxyState>,
        listen: SocketAddr,
    ) -> Result<RunningProxy, ProxyError> {
        let listener = bind(listen).map_err(|source| ProxyError::Listen {
            addr: listen,
            source,
        })?;
        let app = server::router(state.clone());
        let server = forgelog_http::HttpServer::start(listener, app, Default::default())
            .map_err(ProxyError::Serve)?;
        Ok(RunningProxy {
            addr: server.addr(),
            state,
            spool: None,
            server,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until everything recorded so far, and what an earlier process
    /// left in the spool, is in the log (a restarted orchestrator reads the
    /// log only after this).
    pub async fn flush(&self, timeout: Duration) -> Result<(), ProxyError> {
        if let Some(events) = &self.state.events {
            events.flush(timeout).await?;
        }
        Ok(())
    }

    /// Stops serving: lets the calls in flight finish for the config's
    /// `shutdown_grace` and records those left as interrupted; then flushes
    /// what was recorded (to the broker, for up to `flush`) and stops the
    /// spool's drainer, even while a call hung upstream still holds it.
    pub async fn shutdown(self, flush: Duration) -> Result<(), ProxyError> {
        let grace = self.state.config.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace;
        self.server.shutdown(grace).await;
        // Calls outlive their connections (a harness that hung up is still recorded).
        self.state.settle_calls(deadline).await;
        if let Some(events) = &self.state.events {
            events.flush(flush).await?;
        }
        drop(self.state);
        if let Some(spool) = self.spool {
            spool.close(flush).await?;
        }
        Ok(())
    }
}

/// Prints a generated admin token (as Jupyter prints its): the one way to use
/// the session API of a server started without `--admin-token`.
fn print_admin_token(args: &ServeArgs, config: &ProxyConfig) {
    if let (None, Some(token)) = (&args.admin_token, &config.admin_token) {
        eprintln!(
            "session API admin token (no --admin-token given; set FORGELOG_ADMIN_TOKEN to choose one):\n    {token}"
        );
    }
}

/// `forgelog proxy`: serves until Ctrl-C or SIGTERM, then flushes the spool.
/// `token_in`: the tokenizer and template `--tokenizer` named, loaded.
pub async fn run(args: ProxyArgs, token_in: Option<upstream::TokenIn>) -> Result<(), ProxyError> {
    let stop = forgelog_stream::shutdown_signal().map_err(ProxyError::Serve)?;
    let stream = StreamConfig::new(&args.serve.brokers);
    raise_fd_limit();
    let config = ProxyConfig {
        token_in,
        ..args.config()?
    };
    let proxy = RunningProxy::start(
        config.clone(),
        &stream,
        args.spool.clone(),
        args.serve.listen,
    )
    .await?;
    print_admin_token(&args.serve, &config);
    let replica = config.replicas.as_ref().map_or(String::new(), |r| {
        format!(", replica {} of {}", r.index, r.urls.len())
    });
    eprintln!(
        "forgelog proxy on {} -> {} (events to {}, spool {}{replica})",
        proxy.url(),
        args.upstream,
        args.serve.brokers,
        args.spool.display()
    );
    stop.await;
    eprintln!("forgelog proxy: stopping; flushing events to the broker");
    proxy.shutdown(Duration::from_secs(30)).await
}

#[cfg(test)]
mod tests;
