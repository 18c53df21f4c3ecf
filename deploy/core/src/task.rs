//! Harbor-style task directories.
//!
//! ```text
//! my-task/
//!   instruction.md        what the agent is asked to do
//!   task.toml             timeouts, resources, image, network
//!   environment/          how the task's image is made (a Dockerfile), or
//!                         `[environment] docker_image` names a prebuilt one
//!   tests/test.sh         the verifier: writes /logs/verifier/reward.json or reward.txt
//!   solution/solve.sh     optional: the reference solution
//! ```
//!
//! Every `task.toml` key is optional. Keys forgelog does not know are
//! reported as warnings, never errors: task sets carry metadata of their own.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{}: {why}", dir.display())]
    Invalid { dir: PathBuf, why: String },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `task.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct TaskConfig {
    pub version: String,
    /// Free-form: author, difficulty, category, tags, ...
    pub metadata: toml::Table,
    pub agent: AgentConfig,
    pub verifier: VerifierConfig,
    pub environment: EnvironmentConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// The harness is stopped after this long; the verifier still runs.
    pub timeout_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct VerifierConfig {
    pub timeout_sec: f64,
    /// Environment variables of `tests/test.sh`.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct EnvironmentConfig {
    /// A prebuilt image; without it the image is built from `environment/`.
    pub docker_image: Option<String>,
    pub build_timeout_sec: f64,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    /// Whether the sandbox may reach beyond the proxy (default: no).
    pub allow_internet: bool,
}

impl Default for TaskConfig {
    fn default() -> TaskConfig {
        TaskConfig {
            version: "1.0".into(),
            metadata: toml::Table::new(),
            agent: AgentConfig::default(),
            verifier: VerifierConfig::default(),
            environment: EnvironmentConfig::default(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> AgentConfig {
        AgentConfig { timeout_sec: 600.0 }
    }
}

impl Default for VerifierConfig {
    fn default() -> VerifierConfig {
        VerifierConfig {
            timeout_sec: 600.0,
            env: BTreeMap::new(),
        }
    }
}

impl Default for EnvironmentConfig {
    fn default() -> EnvironmentConfig {
        EnvironmentConfig {
            docker_image: None,
            build_timeout_sec: 600.0,
            cpus: None,
            memory_mb: None,
            storage_mb: None,
            allow_internet: false,
        }
    }
}

/// The keys forgelog reads, per table (`""`: the top level). `metadata` is free-form.
const KNOWN: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "version",
            "metadata",
            "agent",
            "verifier",
            "environment",
            "solution",
            "source",
        ],
    ),
    ("agent", &["timeout_sec"]),
    ("verifier", &["timeout_sec", "env"]),
    (
        "environment",
        &[
            "docker_image",
            "build_timeout_sec",
            "cpus",
            "memory_mb",
            "storage_mb",
            "allow_internet",
        ],
    ),
];

impl TaskConfig {
    /// Parses `task.toml`; returns it and a warning per key forgelog does not read.
    pub fn parse(text: &str) -> Result<(TaskConfig, Vec<String>), String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        let mut warnings = Vec::new();
        for (section, keys) in KNOWN {
            let t = if section.is_empty() {
                Some(&table)
            } else {
                table.get(*section).and_then(toml::Value::as_table)
            };
            for key in t.into_iter().flat_map(|t| t.keys()) {
                if !keys.contains(&key.as_str()) {
                    let at = if section.is_empty() {
                        key.clone()
                    } else {
                        format!("{section}.{key}")
                    };
                    warnings.push(format!("unknown key {at} (ignored)"));
                }
            }
        }
        let config: TaskConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| e.to_string())?;
        for (what, secs) in [
            ("agent.timeout_sec", config.agent.timeout_sec),
            ("verifier.timeout_sec", config.verifier.timeout_sec),
            (
                "environment.build_timeout_sec",
                config.environment.build_timeout_sec,
            ),
        ] {
            if !(secs.is_finite() && secs > 0.0) {
                return Err(format!(
                    "{what} must be a positive number of seconds, not {secs}"
                ));
            }
        }
        if config
            .environment
            .cpus
            .is_some_and(|c| !(c.is_finite() && c > 0.0))
        {
            return Err("environment.cpus must be positive".into());
        }
        // An image name a podman command could read as a flag or that names
        // nothing ("image  is not in local storage", found by probing).
        if let Some(image) = &config.environment.docker_image {
            if image.trim().is_empty()
                || image.starts_with('-')
                || image.contains(char::is_whitespace)
            {
                return Err(format!(
                    "environment.docker_image is not an image name: {image:?}"
                ));
            }
        }
        Ok((config, warnings))
    }
}

/// One task, read from its directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The directory's name.
    pub id: String,
    pub dir: PathBuf,
    pub instruction: String,
    pub config: TaskConfig,
    /// Unknown `task.toml` keys, one line each.
    pub warnings: Vec<String>,
}

impl Task {
    /// Reads `dir`: `instruction.md`, `task.toml` and a verifier are required;
    /// an image must be named or buildable from `environment/`.
    pub fn load(dir: &Path) -> Result<Task, TaskError> {
        let invalid = |why: String| TaskError::Invalid {
            dir: dir.to_path_buf(),
            why,
        };
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| TaskError::Read { path, source })
        };
        let id = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty() && !n.starts_with('.'))
            .ok_or_else(|| invalid("a task directory needs a plain name".into()))?
            .to_string();
        let instruction = read("instruction.md")?;
        if instruction.trim().is_empty() {
            return Err(invalid("instruction.md is empty".into()));
        }
        let (config, warnings) = TaskConfig::parse(&read("task.toml")?)
            .map_err(|why| invalid(format!("task.toml: {why}")))?;
        if !dir.join("tests/test.sh").is_file() {
            return Err(invalid("tests/test.sh (the verifier) is missing".into()));
        }
        if config.environment.docker_image.is_none()
            && !dir.join("environment/Dockerfile").is_file()
        {
            return Err(invalid(
                "no image: set [environment] docker_image or add environment/Dockerfile".into(),
            ));
        }
        Ok(Task {
            id,
            dir: dir.to_path_buf(),
            instruction,
            config,
            warnings,
        })
    }

    /// Every task directory directly under `root`, by name: a task is a
    /// directory with a `task.toml`; others are skipped.
    pub fn load_all(root: &Path) -> Result<Vec<Task>, TaskError> {
        let entries = std::fs::read_dir(root).map_err(|source| TaskError::Read {
            path: root.to_path_buf(),
            source,
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.join("task.toml").is_file())
            .collect();
        dirs.sort();
        dirs.iter().map(|d| Task::load(d)).collect()
    }

    /// SHA-256 (hex) of the task's files: each file's path under the task
    /// and its bytes, in path order. Two copies of a task hash alike; a
    /// changed byte, a renamed or an added file does not.
    pub fn sha256(&self) -> Result<String, TaskError> {
        fn files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TaskError> {
            let read = |source| TaskError::Read {
                path: dir.to_path_buf(),
                source,
            };
            for entry in std::fs::read_dir(dir).map_err(read)? {
                let path = entry.map_err(read)?.path();
                if path.is_dir() {
                    files(&path, out)?;
                } else {
                    out.push(path);
                }
            }
            Ok(())
        }
        let mut paths = Vec::new();
        files(&self.dir, &mut paths)?;
        paths.sort();
        let mut all = Vec::new();
        for path in paths {
            let name = path.strip_prefix(&self.dir).unwrap_or(&path);
            let bytes = std::fs::read(&path).map_err(|source| TaskError::Read {
                path: path.clone(),
                source,
            })?;
            for part in [name.to_string_lossy().as_bytes(), &bytes[..]] {
                all.extend((part.len() as u64).to_le_bytes());
                all.extend(part);
            }
        }
        Ok(forgelog_schemas::content_hash(&all))
    }

    /// `solution/solve.sh`, when the task ships one.
    pub fn solution(&self) -> Option<PathBuf> {
        Some(self.dir.join("solution/solve.sh")).filter(|p| p.is_file())
    }

    /// The local images (`localhost/…`) its `environment/Dockerfile` builds
    /// from: images no registry serves, which must be in local storage
    /// before the task can run (the shipped tasks' base is made by
    /// `scripts/base-image.sh`).
    pub fn local_base_images(&self) -> Vec<String> {
        match &self.config.environment.docker_image {
            Some(_) => Vec::new(),
            None => std::fs::read_to_string(self.dir.join("environment/Dockerfile"))
                .map(|d| local_base_images(&d))
                .unwrap_or_default(),
        }
    }
}

/// The `localhost/…` images a Dockerfile's `FROM` lines name (a stage's
/// `AS name` and `--platform` flags aside; stages built from earlier stages
/// are not images).
pub fn local_base_images(dockerfile: &str) -> Vec<String> {
    let mut images = Vec::new();
    for line in dockerfile.lines() {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        let image = words.find(|w| !w.starts_with("--"));
        if let Some(image) = image.filter(|i| i.starts_with("localhost/")) {
            if !images.iter().any(|i| i == image) {
                images.push(image.to_string());
            }
        }
    }
    images
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dockerfile_names_the_local_images_it_builds_from() {
        let d = "# comment FROM localhost/not\nFROM --platform=linux/amd64 localhost/base:1 AS build\n\
                 RUN true\nfrom debian:bookworm\nFROM build\nFROM localhost/base:1\nFROM localhost/other\n";
        assert_eq!(
            local_base_images(d),
            ["localhost/base:1", "localhost/other"]
        );
        assert!(local_base_images("FROM python:3.12\n").is_empty());
        assert!(local_base_images("").is_empty());
    }

    #[test]
    fn a_harbor_task_toml_reads_with_its_defaults_and_unknown_keys_warn() {
        let text = r#"
version = "1.0"
[metadata]
author_name = "A"
difficulty = "easy"
[verifier]
timeout_sec = 120.0
env = { MODE = "strict" }
[agent]
timeout_sec = 300
[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
gpus = 0
[extra]
x = 1
"#;
        let (c, warnings) = TaskConfig::parse(text).unwrap();
        assert_eq!(c.agent.timeout_sec, 300.0);
        assert_eq!(c.verifier.timeout_sec, 120.0);
        assert_eq!(c.verifier.env["MODE"], "strict");
        assert_eq!(
            (c.environment.cpus, c.environment.memory_mb),
            (Some(1.0), Some(2048))
        );
        assert!(!c.environment.allow_internet);
        assert_eq!(c.metadata["difficulty"].as_str(), Some("easy"));
        assert_eq!(
            warnings,
            [
                "unknown key extra (ignored)",
                "unknown key environment.gpus (ignored)"
            ]
        );
        let (empty, none) = TaskConfig::parse("").unwrap();
        assert_eq!((empty, none.len()), (TaskConfig::default(), 0));
    }

    #[test]
    fn bad_values_are_refused_with_the_key_named() {
        for (text, says) in [
            ("[agent]\ntimeout_sec = -1", "agent.timeout_sec"),
            ("[agent]\ntimeout_sec = nan", "agent.timeout_sec"),
            ("[verifier]\ntimeout_sec = \"soon\"", "timeout_sec"),
            ("[environment]\ncpus = 0", "environment.cpus"),
            (
                "[environment]\ndocker_image = \"\"",
                "environment.docker_image",
            ),
            (
                "[environment]\ndocker_image = \"--privileged\"",
                "environment.docker_image is not an image name: \"--privileged\"",
            ),
            (
                "[environment]\ndocker_image = \"ubuntu:24.04 rm\"",
                "environment.docker_image",
            ),
            ("[agent", "expected"),
        ] {
            let err = TaskConfig::parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_task_directory_needs_an_instruction_a_verifier_and_an_image() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("hello");
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::create_dir_all(dir.join("environment")).unwrap();
        std::fs::write(dir.join("instruction.md"), "Say hello.").unwrap();
        std::fs::write(dir.join("task.toml"), "[agent]\ntimeout_sec = 60").unwrap();
        let err = Task::load(&dir).unwrap_err().to_string();
        assert!(err.contains("tests/test.sh"), "{err}");
        std::fs::write(dir.join("tests/test.sh"), "exit 0").unwrap();
        let err = Task::load(&dir).unwrap_err().to_string();
        assert!(err.contains("no image"), "{err}");
        std::fs::write(dir.join("environment/Dockerfile"), "FROM scratch").unwrap();
        let task = Task::load(&dir).unwrap();
        assert_eq!(
            (task.id.as_str(), task.config.agent.timeout_sec),
            ("hello", 60.0)
        );
        assert_eq!(task.solution(), None);
        std::fs::create_dir_all(root.path().join("not-a-task")).unwrap();
        let all = Task::load_all(root.path()).unwrap();
        assert_eq!(all.len(), 1);
    }
}
