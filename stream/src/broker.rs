//! The local Kafka-protocol broker for the embedded default and the tests:
//! tansu 0.6.0 with its SQLite engine, run as a child process.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TANSU_VERSION: &str = "0.6.0";

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("tansu not found: set FORGELOG_TANSU, put it on PATH, or install it with\n  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo install tansu --version {TANSU_VERSION} --locked --features libsql --root {0}")]
    NotInstalled(String),
    #[error("installing tansu failed ({0}); see the cargo output above")]
    Install(String),
    #[error("starting {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("broker did not accept connections on {addr} within {secs}s; see {log}")]
    NotReady {
        addr: SocketAddr,
        secs: u64,
        log: String,
    },
    #[error(
        "{addr} is already in use (another broker?): stop it, or use it with --brokers {addr}"
    )]
    AddressInUse { addr: SocketAddr },
    #[error("broker data directory {dir}: {source}")]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Where forgelog installs tools it builds itself: `$FORGELOG_HOME/tools`, else
/// `~/.cache/forgelog/tools`.
pub fn tools_root() -> PathBuf {
    crate::forgelog_home().join("tools")
}

/// The tansu binary: `$FORGELOG_TANSU`, then `tansu` on `PATH`, then the tools root.
pub fn find_tansu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FORGELOG_TANSU") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("tansu"))
        .find(|p| p.is_file());
    on_path.or_else(|| Some(tools_root().join("bin/tansu")).filter(|p| p.is_file()))
}

/// Finds tansu, or builds it from crates.io into the tools root (about 10
/// minutes on 2 cores), as `scripts/setup.sh` does: at opt-level 1, which
/// builds a fifth faster and serves as fast (its time is SQLite's).
pub fn find_or_install_tansu() -> Result<PathBuf, BrokerError> {
    if let Some(p) = find_tansu() {
        return Ok(p);
    }
    let root = tools_root();
    eprintln!("forgelog: tansu {TANSU_VERSION} is not installed; building it into {} (once per machine, several minutes)", root.display());
    let status = Command::new("cargo")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1")
        .args([
            "install",
            "tansu",
            "--version",
            TANSU_VERSION,
            "--locked",
            "--features",
            "libsql",
            "--root",
        ])
        .arg(&root)
        .status()
        .map_err(|e| BrokerError::Install(e.to_string()))?;
    if !status.success() {
        return Err(BrokerError::Install(status.to_string()));
    }
    find_tansu().ok_or_else(|| BrokerError::NotInstalled(root.display().to_string()))
}

/// A running tansu broker. Stopped when dropped, and when the thread that
/// started it ends (its process killed included).
pub struct LocalBroker {
    child: Child,
    addr: SocketAddr,
    data_dir: PathBuf,
    binary: PathBuf,
}

impl LocalBroker {
    /// Starts tansu on `addr` with its SQLite database in `data_dir` and waits until it accepts connections.
    pub fn start(
        binary: &Path,
        data_dir: &Path,
        addr: SocketAddr,
    ) -> Result<LocalBroker, BrokerError> {
        Self::start_advertising(binary, data_dir, addr, addr)
    }

    /// As [`LocalBroker::start`], telling clients to connect to `advertised`
    /// instead (a TLS front, say: clients reconnect to what metadata names).
    pub fn start_advertising(
        binary: &Path,
        data_dir: &Path,
        addr: SocketAddr,
        advertised: SocketAddr,
    ) -> Result<LocalBroker, BrokerError> {
        let data_err = |source| BrokerError::DataDir {
            dir: data_dir.to_path_buf(),
            source,
        };
        // On a busy port tansu exits (AddrInUse) while the readiness check below
        // would connect to whatever listens there and call it ready. Refuse first.
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            return Err(BrokerError::AddressInUse { addr });
        }
        std::fs::create_dir_all(data_dir).map_err(data_err)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data_dir.join("broker.log"))
            .map_err(data_err)?;
        let (url, advertised) = (format!("tcp://{addr}"), format!("tcp://{advertised}"));
        // The SQLite path is relative to the working directory: run inside the data dir.
        let mut command = Command::new(binary);
        stop_with_this_thread(&mut command);
        let child = command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
                "--storage-engine",
                "sqlite://tansu.db",
            ])
            .current_dir(data_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(data_err)?)
            .stderr(log)
            .spawn()
            .map_err(|source| BrokerError::Spawn {
                binary: binary.to_path_buf(),
                source,
            })?;
        let broker = LocalBroker {
            child,
            addr,
            data_dir: data_dir.to_path_buf(),
            binary: binary.to_path_buf(),
        };
        broker.wait_ready(Duration::from_secs(30))?;
        Ok(broker)
    }

    fn wait_ready(&self, within: Duration) -> Result<(), BrokerError> {
        let start = Instant::now();
        while start.elapsed() < within {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(BrokerError::NotReady {
            addr: self.addr,
            secs: within.as_secs(),
            log: self.data_dir.join("broker.log").display().to_string(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops with SIGTERM and waits (tansu keeps its data and committed offsets).
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }

    /// `kill -9`: the crash a fault test wants.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Waits for the child to exit (for `forgelog broker`, which runs it in the foreground).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait()
    }

    fn signal(&self, sig: i32) {
        signal(self.child.id(), sig);
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Has the child sent SIGTERM (a clean stop, as [`LocalBroker::stop`]'s)
/// when the thread that starts it ends, `kill -9` of its process included:
/// an orphaned tansu kept the port and the data, and the next `forgelog up`
/// refused to start ("already in use") until the operator found and killed it.
fn stop_with_this_thread(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure only calls prctl(2) and
    // getppid(2), which are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A parent gone before prctl sends no signal: do not start.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sends SIGTERM to a broker started by [`LocalBroker::start`] (by pid, for a
/// caller that lent the `LocalBroker` to a waiting thread).
pub fn terminate(pid: u32) {
    signal(pid, libc::SIGTERM);
}
