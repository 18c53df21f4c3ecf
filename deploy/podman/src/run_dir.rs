//! A run's directory on the orchestrator's machine, `$FORGELOG_HOME/runs/R`:
//! the lock that says an orchestrator of R is alive, the network slots its
//! sandboxes hold, the proxy's spool and each attempt's harness output. A
//! starting orchestrator reaps what dead runs left: their sandboxes (by
//! label) and their network namespaces.

use crate::{remove_slot, Podman, SandboxError};
use std::fs::File;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("run {run} is being orchestrated by another live process (pid {holder}, lock {path})")]
    Busy {
        run: String,
        path: PathBuf,
        holder: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A run's directory, locked by this process while it lives.
#[derive(Debug)]
pub struct RunDir {
    pub run: String,
    pub path: PathBuf,
    _lock: File,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.into(),
        source,
    }
}

/// Locks `dir`'s lock file, if no live process holds it (the lock goes with
/// the process, however it dies).
fn try_lock(dir: &Path) -> Result<Option<File>, RunDirError> {
    let path = dir.join("lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
    }
}

impl RunDir {
    /// `runs/run` under `home`, locked; refused while another process holds
    /// it. A holder is waited for up to 10 s: an orchestrator killed a moment
    /// ago may not have let go yet (seen under load right after `kill -9`).
    pub fn acquire(home: &Path, run: &str) -> Result<RunDir, RunDirError> {
        let path = home.join("runs").join(run);
        std::fs::create_dir_all(path.join("slots")).map_err(io(&path))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(mut lock) = try_lock(&path)? {
                // Who holds it, for whoever finds it held.
                use std::io::{Seek, Write};
                let _ = lock.set_len(0);
                let _ = lock.rewind();
                let _ = write!(lock, "{}", std::process::id());
                return Ok(RunDir {
                    run: run.to_string(),
                    path,
                    _lock: lock,
                });
            }
            if std::time::Instant::now() > deadline {
                let holder = std::fs::read_to_string(path.join("lock")).unwrap_or_default();
                return Err(RunDirError::Busy {
                    run: run.into(),
                    path: path.join("lock"),
                    holder,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Notes that network slot `n` is this run's until [`RunDir::slot_freed`].
    pub fn slot_taken(&self, n: u32) {
        let _ = std::fs::write(self.path.join("slots").join(n.to_string()), "");
    }

    pub fn slot_freed(&self, n: u32) {
        let _ = std::fs::remove_file(self.path.join("slots").join(n.to_string()));
    }

    pub fn spool(&self) -> PathBuf {
        self.path.join("spool")
    }

    /// Removes this run's sandboxes and networks (after an interrupted run:
    /// what was in flight when it stopped).
    pub async fn clean_up(&self, podman: &Podman) -> Result<(), SandboxError> {
        reap_run(podman, &self.run, &self.path).await
    }

    /// Where attempt `id`'s harness output is kept.
    pub fn attempt_logs(&self, id: &str) -> PathBuf {
        self.path.join("attempts").join(id)
    }
}

/// Reaps what runs without a live orchestrator left under `home`: their
/// sandboxes and network slots. Returns the runs reaped. Sandboxes of runs
/// with no directory here (another home, `tasks check`) are left alone.
pub async fn reap_dead_runs(podman: &Podman, home: &Path) -> Result<Vec<String>, SandboxError> {
    let with_sandboxes = podman.runs().await?;
    let Ok(dirs) = std::fs::read_dir(home.join("runs")) else {
        return Ok(Vec::new());
    };
    let mut reaped = Vec::new();
    for dir in dirs.flatten() {
        let run = dir.file_name().to_string_lossy().into_owned();
        if slots(&dir.path()).is_empty() && !with_sandboxes.contains(&run) {
            continue;
        }
        let Ok(Some(_lock)) = try_lock(&dir.path()) else {
            continue;
        };
        reap_run(podman, &run, &dir.path()).await?;
        reaped.push(run);
    }
    Ok(reaped)
}

fn slots(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir.join("slots"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes run `run`'s sandboxes and the network slots noted in `dir`.
async fn reap_run(podman: &Podman, run: &str, dir: &Path) -> Result<(), SandboxError> {
    podman.reap(Some(run)).await?;
    for n in slots(dir) {
        remove_slot(n).await;
        let _ = std::fs::remove_file(dir.join("slots").join(n.to_string()));
    }
    Ok(())
}
