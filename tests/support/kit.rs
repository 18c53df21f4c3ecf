//! The harness kit (`deploy/harnesses`) through a real `forgelog proxy` in front
//! of the fake vLLM-compatible upstream: shared by the harness test and the
//! `log-volume` bench.

use forgelog_api::{Finish, NewSession, SessionClient};
use forgelog_producers::fake_upstream::{self, FakeOptions, FakeUpstream};
use forgelog_schemas::compact::SessionVolume;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, StreamConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The kit's harnesses the tests run: every one of its table
/// (`FORGELOG_KIT_ONLY=a,b`: only those, when working on one).
pub fn harnesses() -> Vec<&'static str> {
    let only = std::env::var("FORGELOG_KIT_ONLY").ok();
    forgelog_deploy::harness::pinned()
        .map(|h| h.name)
        .filter(|h| only.as_ref().is_none_or(|o| o.split(',').any(|x| x == *h)))
        .collect()
}

/// Harnesses that give the model no tools (aider edits files from the text of
/// the answer): one exchange per message, never reaching a budget.
pub const TEXT_ONLY: [&str; 1] = ["aider"];
pub const ADMIN: &str = "harness-test-admin";
/// More steps than any budget: every harness is ended by the budget stop.
/// Where a harness offers a sub-agent tool (Claude Code's `Agent`, OpenCode's
/// `task`), the first step is delegated to a sub-agent.
pub const TASK: &str = "Create a file hello.txt containing the word hello. [agent:20] [delegate]";

/// What rollout `rollout`'s calls cost in the log (`events` as it holds them).
pub fn volume_of(events: &[Event], rollout: &str) -> SessionVolume {
    SessionVolume::of(events.iter().filter(|e| match e {
        Event::CallStarted(c) => c.rollout_id == rollout,
        Event::CallFinished(c) => c.rollout_id == rollout,
        _ => false,
    }))
}

pub fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/harnesses")
}

/// Fails with a clear message when install.sh has not installed a harness.
pub fn require_installed() {
    let home = forgelog_stream::forgelog_home();
    for h in forgelog_deploy::harness::pinned() {
        let stamp = home
            .join("harnesses")
            .join(h.name)
            .join(".forgelog-version");
        let have = std::fs::read_to_string(&stamp).unwrap_or_default();
        assert_eq!(
            have.trim(),
            h.version,
            "{} {} is not installed ({}): run deploy/harnesses/install.sh (scripts/sandbox-setup.sh does)",
            h.name,
            h.version,
            stamp.display()
        );
    }
}

/// `forgelog proxy` as a process of its own in front of `upstream`,
/// recording run `run` with the admin token [`ADMIN`]; killed when dropped.
pub struct ProxyProcess {
    pub url: String,
    child: Option<Child>,
    _spool: tempfile::TempDir,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl ProxyProcess {
    /// Starts it with `extra` flags and waits until it answers `/healthz`.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        upstream: &str,
        stream: &StreamConfig,
        run: &str,
        extra: &[&std::ffi::OsStr],
    ) -> ProxyProcess {
        let listen = free_local_addr();
        let spool = tempfile::tempdir().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(["proxy", "--upstream", upstream])
            .args([
                "--listen",
                &listen.to_string(),
                "--brokers",
                &stream.brokers,
            ])
            .args(["--run", run, "--admin-token", ADMIN])
            .arg("--spool")
            .arg(spool.path())
            .args(extra)
            .spawn()
            .unwrap();
        let proxy = ProxyProcess {
            url: format!("http://{listen}"),
            child: Some(child),
            _spool: spool,
        };
        let http = reqwest::Client::new();
        rt.block_on(async {
            for _ in 0..300 {
                if let Ok(r) = http.get(format!("{}/healthz", proxy.url)).send().await {
                    if r.status().is_success() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the proxy did not come up");
        });
        proxy
    }

    /// SIGTERM: it stops serving, flushes its spool to the broker and exits 0.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                assert!(status.success(), "proxy exited {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A [`ProxyProcess`] in front of the fake upstream, recording run `run`.
pub struct KitProxy {
    pub url: String,
    pub run: String,
    pub stream: StreamConfig,
    pub fake: Arc<FakeUpstream>,
    pub sessions: SessionClient,
    proxy: ProxyProcess,
    marks: Vec<(Topic, i32, i64)>,
}

impl KitProxy {
    pub fn start(rt: &tokio::runtime::Runtime, run_prefix: &str) -> KitProxy {
        let stream = rt.block_on(shared_broker());
        let run = unique_run_id(run_prefix);
        let marks = topic_ends(&stream);
        let (upstream, fake) = rt
            .block_on(fake_upstream::spawn(
                "127.0.0.1:0".parse().unwrap(),
                FakeOptions {
                    keep_answers: true,
                    ..Default::default()
                },
            ))
            .unwrap();
        let proxy = ProxyProcess::start(rt, &format!("http://{upstream}"), &stream, &run, &[]);
        KitProxy {
            sessions: SessionClient::new(&proxy.url, Some(ADMIN.into())),
            url: proxy.url.clone(),
            run,
            stream,
            fake,
            proxy,
            marks,
        }
    }

    /// Runs harness `h` on `task` once, in a session of its own (rollout id
    /// `h`) with a budget of `budget` model calls; its files go to `out`.
    pub fn run_harness(
        &self,
        rt: &tokio::runtime::Runtime,
        h: &str,
        budget: u32,
        task: &str,
        out: &Path,
    ) -> ExitStatus {
        let new = NewSession::new(h, "hello", h, "g").max_model_calls(budget);
        let session = rt.block_on(self.sessions.create(&new)).unwrap();
        let started = Instant::now();
        let status = Command::new(kit().join("run.sh"))
            .args([h, &self.url, &session.api_key])
            .arg(out)
            .arg(task)
            .env("FORGELOG_HARNESS_TIMEOUT", "240")
            .status()
            .unwrap();
        eprintln!("{h}: {status} in {:.1} s", started.elapsed().as_secs_f64());
        // Nothing the harness started outlives its run (Cline's CLI leaves a
        // hub daemon behind), and its sandbox is gone.
        let work = std::fs::read_to_string(out.join("sandbox")).expect("run.sh names its sandbox");
        let work = work.trim_end();
        let survivors = processes_mentioning(work);
        assert!(survivors.is_empty(), "{h} left running: {survivors:?}");
        assert!(!Path::new(work).exists(), "{h}'s sandbox {work} is left");
        let exited = Finish {
            exit_status: status.code().map(i64::from),
            verifier: None,
            ..Default::default()
        };
        let done = rt
            .block_on(self.sessions.finish(&session.session_id, &exited))
            .unwrap();
        eprintln!("{h}: {} model calls recorded", done.model_calls);
        status
    }

    /// SIGTERM: the proxy stops serving and flushes its spool to the broker;
    /// then the run's events as the log holds them (calls first, then rollouts).
    pub fn stop(self) -> Vec<Event> {
        self.proxy.stop();
        read_events(&self.stream, &self.run, &self.marks)
    }
}

fn topic_ends(stream: &StreamConfig) -> Vec<(Topic, i32, i64)> {
    let reader = ReplayReader::new(stream).unwrap();
    let mut marks = Vec::new();
    for topic in [Topic::Calls, Topic::Rollouts] {
        for p in reader.partitions(topic.name()).unwrap() {
            marks.push((topic, p, reader.end(topic.name(), p).unwrap()));
        }
    }
    marks
}

fn read_events(stream: &StreamConfig, run: &str, marks: &[(Topic, i32, i64)]) -> Vec<Event> {
    let reader = ReplayReader::new(stream).unwrap();
    let mut out = Vec::new();
    for &(topic, p, from) in marks {
        let to = reader.end(topic.name(), p).unwrap();
        let _all_read = reader
            .for_each_in(topic.name(), p, from, to, |r| {
                if r.in_run(Some(run)) {
                    out.push(r.event.expect("decodable event"));
                }
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
    }
    out
}

/// The command lines of this machine's processes that name `path`.
fn processes_mentioning(path: &str) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(path))
        .collect()
}
