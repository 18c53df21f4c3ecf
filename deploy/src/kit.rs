//! The tasks and harnesses a run runs, chosen from a tasks directory and the
//! kit: for a new run (`forgelog run`), for the re-run of a recorded one
//! (`run --replay`); and what they were, as SHA-256s keyed `task/ID` and
//! `harness/NAME`, which a bundle carries and a replay compares.

use crate::harness::{Harness, HarnessError};
use forgelog_deploy_core::{RunPlan, Task, TaskError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a kit could not be made of.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("no tasks in {} (a task is a directory with a task.toml)", .0.display())]
    NoTasks(PathBuf),
    #[error("no task {} in {}: its tasks are {}", unknown.join(", "), dir.display(), known.join(", "))]
    UnknownTasks {
        unknown: Vec<String>,
        dir: PathBuf,
        known: Vec<String>,
    },
    #[error("run {run} ran task {task}, which is not in {}", dir.display())]
    MissingTask {
        run: String,
        task: String,
        dir: PathBuf,
    },
    #[error("run {run} ran harness {harness}, which is not a built-in one: {source}")]
    MissingHarness {
        run: String,
        harness: String,
        source: HarnessError,
    },
}

/// Tasks by id and harnesses by name, each with its bundle installed.
#[derive(Debug, Clone, Default)]
pub struct Kit {
    pub tasks: BTreeMap<String, Task>,
    pub harnesses: BTreeMap<String, Harness>,
}

impl Kit {
    /// The tasks of `tasks_dir` (those named in `only`, or all) and the
    /// harnesses `specs` name, their bundles installed under `bundles`.
    pub fn for_run(
        tasks_dir: &Path,
        only: &[String],
        specs: &[String],
        bundles: &Path,
    ) -> Result<Kit, KitError> {
        let mut tasks: BTreeMap<String, Task> = Task::load_all(tasks_dir)?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        if tasks.is_empty() {
            return Err(KitError::NoTasks(tasks_dir.to_path_buf()));
        }
        // A task asked for by a name the directory lacks is a typo, not a
        // smaller run (it was left out without a word).
        let unknown: Vec<String> = only
            .iter()
            .filter(|id| !tasks.contains_key(*id))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(KitError::UnknownTasks {
                unknown,
                dir: tasks_dir.to_path_buf(),
                known: tasks.into_keys().collect(),
            });
        }
        if !only.is_empty() {
            tasks.retain(|id, _| only.contains(id));
        }
        let mut harnesses = BTreeMap::new();
        for spec in specs {
            let h = Harness::resolve(spec)?;
            h.check_bundle(bundles)?;
            harnesses.insert(h.name.clone(), h);
        }
        Ok(Kit { tasks, harnesses })
    }

    /// The tasks (from `tasks_dir`) and the kit's harnesses a recorded
    /// run's plan ran.
    pub fn of_recorded(plan: &RunPlan, tasks_dir: &Path, bundles: &Path) -> Result<Kit, KitError> {
        let all: BTreeMap<String, Task> = Task::load_all(tasks_dir)?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        let mut kit = Kit::default();
        for g in &plan.groups {
            let task = all.get(&g.task).ok_or_else(|| KitError::MissingTask {
                run: plan.run_id.clone(),
                task: g.task.clone(),
                dir: tasks_dir.to_path_buf(),
            })?;
            kit.tasks.insert(g.task.clone(), task.clone());
            let harness =
                Harness::resolve(&g.harness).map_err(|source| KitError::MissingHarness {
                    run: plan.run_id.clone(),
                    harness: g.harness.clone(),
                    source,
                })?;
            harness.check_bundle(bundles)?;
            kit.harnesses.insert(g.harness.clone(), harness);
        }
        Ok(kit)
    }

    /// The run's tasks `task_ids` loaded from `tasks_dir` (where given) and
    /// its harnesses `names` that are the kit's: what a bundle hashes. A
    /// harness of the user's own has no launch script here to hash.
    pub fn of_names(
        task_ids: impl IntoIterator<Item = String>,
        tasks_dir: Option<&Path>,
        names: impl IntoIterator<Item = String>,
    ) -> Result<Kit, KitError> {
        let mut kit = Kit::default();
        if let Some(dir) = tasks_dir {
            for id in task_ids {
                kit.tasks.insert(id.clone(), Task::load(&dir.join(&id))?);
            }
        }
        for name in names {
            if let Ok(h) = Harness::resolve(&name) {
                kit.harnesses.insert(name, h);
            }
        }
        Ok(kit)
    }

    /// The tasks (loaded from `tasks_dir`, where given) and the kit's
    /// harnesses a recorded run's rollouts started with: what its bundle
    /// hashes.
    pub fn of_started<'e>(
        events: impl IntoIterator<Item = &'e forgelog_schemas::Event>,
        tasks_dir: Option<&Path>,
    ) -> Result<Kit, KitError> {
        let (mut task_ids, mut names) = (BTreeSet::new(), BTreeSet::new());
        for e in events {
            if let forgelog_schemas::Event::RolloutStarted(s) = e {
                task_ids.insert(s.task_id.clone());
                names.insert(s.harness.clone());
            }
        }
        Kit::of_names(task_ids, tasks_dir, names)
    }

    /// The SHA-256 of each task's files and each harness's launch script,
    /// keyed `task/ID` and `harness/NAME` (`None`: no script to hash).
    pub fn hashes(&self) -> Result<BTreeMap<String, Option<String>>, KitError> {
        let mut hashes = BTreeMap::new();
        for (id, task) in &self.tasks {
            hashes.insert(format!("task/{id}"), Some(task.sha256()?));
        }
        for (name, h) in &self.harnesses {
            hashes.insert(format!("harness/{name}"), h.launch_script_sha256());
        }
        Ok(hashes)
    }

    /// How this kit differs from the one a bundled run was made with (its
    /// manifest's `recorded` hashes), in words: a replay of a changed task
    /// or script is a different experiment.
    pub fn differences_from(
        &self,
        recorded: &BTreeMap<String, Vec<String>>,
    ) -> Result<Vec<String>, KitError> {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        let mut said = Vec::new();
        for (what, sha) in self.hashes()? {
            let Some(theirs) = recorded.get(&what) else {
                continue;
            };
            match sha {
                Some(ours) if theirs.contains(&ours) => {}
                Some(ours) => said.push(format!(
                    "{what} differs from the one the bundle's run used (sha256 {} there, {} here)",
                    theirs.first().map_or(String::new(), |s| short(s)),
                    short(&ours)
                )),
                None => said.push(format!("{what} has no launch script here to compare")),
            }
        }
        Ok(said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(root: &Path, id: &str, instruction: &str) {
        let dir = root.join(id);
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(dir.join("instruction.md"), instruction).unwrap();
        std::fs::write(
            dir.join("task.toml"),
            "[environment]\ndocker_image = \"ubuntu:24.04\"\n",
        )
        .unwrap();
        std::fs::write(dir.join("tests/test.sh"), "exit 0\n").unwrap();
    }

    /// Found by probing `run --task nosuch`: it said "no tasks in DIR", and
    /// `--task hello-file --task nosuch` ran hello-file without a word.
    #[test]
    fn a_task_asked_for_that_the_directory_lacks_is_named() {
        let root = tempfile::tempdir().unwrap();
        task(root.path(), "a", "do a");
        task(root.path(), "b", "do b");
        let bundles = root.path().join("bundles");
        let only = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let kit = |ids: &[&str]| Kit::for_run(root.path(), &only(ids), &[], &bundles);
        let chosen = kit(&["b"]).unwrap();
        assert_eq!(chosen.tasks.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(kit(&[]).unwrap().tasks.len(), 2);
        let err = kit(&["b", "nosuch", "c"]).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "no task nosuch, c in {}: its tasks are a, b",
                root.path().display()
            )
        );
    }

    #[test]
    fn a_kit_hashes_its_tasks_and_says_which_changed() {
        let root = tempfile::tempdir().unwrap();
        task(root.path(), "a", "do a");
        task(root.path(), "b", "do b");
        let kit = Kit::of_names(
            ["a".into(), "b".into()],
            Some(root.path()),
            ["mine.sh".into()],
        )
        .unwrap();
        let hashes = kit.hashes().unwrap();
        assert_eq!(hashes.keys().collect::<Vec<_>>(), ["task/a", "task/b"]);
        let recorded: BTreeMap<String, Vec<String>> = hashes
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().collect()))
            .collect();
        assert!(kit.differences_from(&recorded).unwrap().is_empty());
        task(root.path(), "b", "do b differently");
        let changed = Kit::of_names(["a".into(), "b".into()], Some(root.path()), []).unwrap();
        let said = changed.differences_from(&recorded).unwrap();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].starts_with("task/b differs"), "{said:?}");
    }

    #[test]
    fn a_recorded_runs_kit_is_the_tasks_and_kit_harnesses_its_rollouts_started() {
        let root = tempfile::tempdir().unwrap();
        task(root.path(), "task-0", "do 0");
        task(root.path(), "task-1", "do 1");
        let events = forgelog_schemas::testing::recorded_run("r", 2, 2, 1, 4);
        let kit = Kit::of_started(&events, Some(root.path())).unwrap();
        assert_eq!(kit.tasks.keys().collect::<Vec<_>>(), ["task-0", "task-1"]);
        assert_eq!(
            kit.harnesses.keys().collect::<Vec<_>>(),
            ["claude-code", "opencode"]
        );
        // Without the tasks' folder: the harnesses alone; a task the folder
        // lacks is named.
        assert!(Kit::of_started(&events, None).unwrap().tasks.is_empty());
        std::fs::remove_dir_all(root.path().join("task-1")).unwrap();
        let missing = Kit::of_started(&events, Some(root.path())).unwrap_err();
        assert!(missing.to_string().contains("task-1"), "{missing}");
    }

    #[test]
    fn a_run_without_tasks_or_with_an_unknown_harness_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let bundles = root.path().join("bundles");
        let none = Kit::for_run(root.path(), &[], &[], &bundles).unwrap_err();
        assert!(matches!(none, KitError::NoTasks(_)), "{none}");
        task(root.path(), "a", "do a");
        let unknown = Kit::for_run(root.path(), &[], &["no-such-cli".into()], &bundles);
        assert!(unknown
            .unwrap_err()
            .to_string()
            .contains("unknown harness 'no-such-cli'"));
        let only = Kit::for_run(root.path(), &["zzz".into()], &[], &bundles).unwrap_err();
        assert!(matches!(only, KitError::UnknownTasks { .. }), "{only}");
    }
}
