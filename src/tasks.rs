//! `forgelog tasks check DIR`: every task's reference solution through its
//! own verifier, each in a sandbox of its own.

use anyhow::{bail, Result};
use forgelog_deploy_core::Task;
use forgelog_podman::check::check_task;
use forgelog_podman::Podman;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Subcommand)]
pub enum TasksAction {
    /// Run each task's solution/solve.sh in the task's image, then its tests/test.sh;
    /// exits 1 unless every solution scores 1
    #[command(after_help = "Example:\n  forgelog tasks check deploy/tasks --task count-lines")]
    Check {
        /// A directory of Harbor-style task directories (e.g. deploy/tasks)
        dir: PathBuf,
        /// Only these tasks (by directory name)
        #[arg(long = "task")]
        tasks: Vec<String>,
        /// The run id the sandboxes are labelled with (default: check-<pid>)
        #[arg(long, env = "FORGELOG_RUN")]
        run: Option<String>,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: TasksAction) -> Result<()> {
    let TasksAction::Check { dir, tasks, run } = action;
    let all = Task::load_all(&dir)?;
    let chosen: Vec<&Task> = all
        .iter()
        .filter(|t| tasks.is_empty() || tasks.contains(&t.id))
        .collect();
    if chosen.is_empty() {
        bail!(
            "no tasks in {} (a task is a directory with a task.toml)",
            dir.display()
        );
    }
    for t in &chosen {
        for w in &t.warnings {
            eprintln!("{}: {w}", t.id);
        }
    }
    let podman = Podman::default();
    let run_id = run.unwrap_or_else(|| format!("check-{}", std::process::id()));
    let mut failed = 0;
    for task in &chosen {
        let started = Instant::now();
        let check = rt.block_on(check_task(&podman, task, &run_id));
        let reward = check.reward.map_or("null".to_string(), |r| r.to_string());
        println!(
            "{:<24} {:<16} reward {reward:<5} {:>5.1} s{}",
            check.task,
            check.status.name(),
            started.elapsed().as_secs_f64(),
            check
                .why
                .as_ref()
                .map(|w| format!("  ({w})"))
                .unwrap_or_default()
        );
        failed += usize::from(!check.passed());
    }
    let _ = rt.block_on(podman.reap(Some(&run_id)));
    println!("tasks: {} passed, {failed} failed", chosen.len() - failed);
    if failed > 0 {
        let n = chosen.len();
        return Err(
            crate::Found(format!("tasks check: {failed} of {n} tasks did not pass")).into(),
        );
    }
    Ok(())
}
