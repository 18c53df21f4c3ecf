//! Several instances of one consumer sharing its work (`forgelog consume
//! --scale-out`).
//!
//! The work is cut into tasks: one per input partition (`p0`, `p1`, …) for a
//! co-partitioned processor ([`Processor::CO_PARTITIONED`]), else one
//! (`all`). A task is a state directory under `<state>/tasks/`, with its own
//! checkpoint and output spool, and whoever holds its spool's lock owns it:
//! the state travels with the task, and no task ever runs twice at once.
//!
//! Instances share the state directory (a local disk, or a volume every
//! instance mounts) and register in `<state>/members/`, each holding a lock on
//! its own file while it lives. Each takes its share, ⌈tasks / live
//! instances⌉, and hands back what is over it (a last sweep, a checkpoint, the
//! spool flushed, then the lock). An instance killed with `-9` drops its locks
//! with its process: the others take its tasks from their last checkpoints and
//! drain what their spools held, which is the shell's own crash recovery, so
//! nothing is lost or sent twice.

use crate::shell::{self, RunStats, ShellError, ShellOptions};
use crate::Processor;
use forgelog_stream::{LogReader, ReplayReader, Spool, SpoolError, StreamConfig};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One unit of a consumer's work.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Task {
    name: String,
    partition: Option<i32>,
}

/// The tasks of `P` over the log as it is laid out now.
fn tasks_of<P: Processor>(reader: &impl LogReader) -> Result<Vec<Task>, ShellError> {
    if !P::CO_PARTITIONED {
        return Ok(vec![Task {
            name: "all".into(),
            partition: None,
        }]);
    }
    let counts = P::INPUTS
        .iter()
        .map(|t| Ok((t.name(), reader.partitions(t.name())?)))
        .collect::<Result<BTreeMap<_, _>, ShellError>>()?;
    let first = counts.values().next().cloned().unwrap_or_default();
    if counts.values().any(|p| *p != first) {
        return Err(ShellError::Layout(format!(
            "{} reads topics with different partitions ({counts:?}): a key lands in partitions of different numbers",
            P::NAME
        )));
    }
    Ok(first
        .into_iter()
        .map(|p| Task {
            name: format!("p{p}"),
            partition: Some(p),
        })
        .collect())
}

/// This instance's registration: a locked file in `<state>/members/`, which
/// also says which tasks the instance holds (for operators and tests).
struct Membership {
    dir: PathBuf,
    file: File,
}

impl Membership {
    fn join(dir: &Path) -> std::io::Result<Membership> {
        std::fs::create_dir_all(dir)?;
        let name = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        // Locked before it gets its name, so no peer ever sees it unlocked
        // and takes it for a dead member's.
        let tmp = dir.join(format!(".{name}.joining"));
        let file = File::create(&tmp)?;
        file.lock()?;
        std::fs::rename(&tmp, dir.join(&name))?;
        Ok(Membership {
            dir: dir.to_path_buf(),
            file,
        })
    }

    /// Instances alive now, this one included; dead members' files are removed.
    fn live(&self) -> std::io::Result<usize> {
        let mut live = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let Ok(file) = File::open(&path) else {
                continue; // removed meanwhile
            };
            match file.try_lock_shared() {
                Err(std::fs::TryLockError::WouldBlock) => live += 1,
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
        Ok(live.max(1))
    }

    fn publish(&self, held: &[&str]) -> std::io::Result<()> {
        use std::io::{Seek, Write};
        let line = serde_json::json!({"pid": std::process::id(), "tasks": held}).to_string();
        let mut f = &self.file;
        f.set_len(0)?;
        f.seek(std::io::SeekFrom::Start(0))?;
        f.write_all(line.as_bytes())
    }
}

struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<RunStats, ShellError>>,
}

/// Runs this instance's share of `P`'s tasks until `options.stop`, starting
/// each with `fresh()`. Blocking, inside a tokio runtime context.
pub fn run_scaled<P: Processor>(
    config: &StreamConfig,
    fresh: impl Fn() -> P,
    options: &ShellOptions,
) -> Result<RunStats, ShellError> {
    let rt = tokio::runtime::Handle::current();
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ShellError::State { path, source }
    };
    let members_dir = options.state_dir.join("members");
    let member = Membership::join(&members_dir).map_err(io_err(&members_dir))?;
    let tasks_dir = options.state_dir.join("tasks");
    let mut tasks: Vec<Task> = Vec::new();
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut total = RunStats::default();
    loop {
        // Tasks that ended: handed back, lost a race for their lock, or failed.
        let ended: Vec<String> = running
            .iter()
            .filter(|(_, r)| r.thread.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for name in ended {
            let run = running.remove(&name).expect("listed");
            match join(run.thread) {
                Ok(stats) => total += &stats,
                Err(ShellError::Spool(SpoolError::InUse { .. })) => {}
                Err(e) => {
                    let _ = stop_all(running);
                    return Err(e);
                }
            }
        }
        if options.stop.load(Ordering::Relaxed) {
            total += &stop_all(running)?;
            return Ok(total);
        }

        // The log's layout, read until it is known (a broker may be down at start).
        if tasks.is_empty() {
            match ReplayReader::new(config)
                .map_err(ShellError::from)
                .and_then(|r| tasks_of::<P>(&r))
            {
                Ok(t) => tasks = t,
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %e, "consumer: the log is unreachable")
                }
                Err(e) => return Err(e),
            }
        }

        let live = member.live().map_err(io_err(&members_dir))?;
        let share = tasks.len().div_ceil(live);
        // Over the share: hand back the last-taken tasks first.
        while running.len() > share {
            let name = running.keys().next_back().cloned().expect("non-empty");
            let run = running.remove(&name).expect("listed");
            run.stop.store(true, Ordering::Relaxed);
            tracing::info!(consumer = P::NAME, task = %name, live, "handing back");
            total += &join(run.thread)?;
        }
        for task in &tasks {
            if running.len() >= share {
                break;
            }
            let dir = tasks_dir.join(&task.name);
            if running.contains_key(&task.name) || Spool::in_use(&dir.join("spool")) {
                continue;
            }
            tracing::info!(consumer = P::NAME, task = %task.name, live, "taking");
            metrics::counter!("forgelog_consumer_tasks_taken_total", "consumer" => P::NAME)
                .increment(1);
            let stop = Arc::new(AtomicBool::new(false));
            let task_options = ShellOptions {
                state_dir: dir,
                partition: task.partition,
                exit_when_idle: false,
                stop: stop.clone(),
                ..options.clone()
            };
            let (config, rt, processor) = (config.clone(), rt.clone(), fresh());
            let thread = std::thread::Builder::new()
                .name(format!("{}-{}", P::NAME, task.name))
                .spawn(move || {
                    let _runtime = rt.enter();
                    shell::run(&config, processor, &task_options)
                })
                .map_err(|e| ShellError::Thread(e.to_string()))?;
            running.insert(task.name.clone(), Running { stop, thread });
        }
        metrics::gauge!("forgelog_consumer_tasks_held", "consumer" => P::NAME)
            .set(running.len() as f64);
        let held: Vec<&str> = running.keys().map(String::as_str).collect();
        member.publish(&held).map_err(io_err(&members_dir))?;
        std::thread::sleep(options.idle_wait);
    }
}

fn join(thread: JoinHandle<Result<RunStats, ShellError>>) -> Result<RunStats, ShellError> {
    thread
        .join()
        .map_err(|_| ShellError::Thread("a consumer task panicked".into()))?
}

/// Stops every task (each ends after its sweep, with a checkpoint), waits
/// for them all, and returns what they did (or the first failure).
fn stop_all(running: BTreeMap<String, Running>) -> Result<RunStats, ShellError> {
    for run in running.values() {
        run.stop.store(true, Ordering::Relaxed);
    }
    let mut total = RunStats::default();
    let mut failed = None;
    for run in running.into_values() {
        match join(run.thread) {
            Ok(stats) => total += &stats,
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    failed.map_or(Ok(total), Err)
}
