//! Harnesses as `forgelog run` starts them: a launch script run with bash in
//! the sandbox's `/app`, its bundle (node and the CLI, or a venv) mounted
//! read-only from `$FORGELOG_HOME/harnesses`, built once by
//! `deploy/harnesses/install.sh`, never installed at rollout time.
//!
//! A launch script gets `FORGELOG_BASE_URL` (the proxy, as the sandbox
//! reaches it), `FORGELOG_API_KEY` (the session's key), `FORGELOG_INSTRUCTION`
//! (a file holding the task's instruction), `FORGELOG_BUNDLES` (the bundles'
//! directory), `FORGELOG_AGENT_LOGS` (where to leave transcripts), and a fresh
//! `HOME`. `solve` is no harness: it runs the task's `solution/solve.sh`.

use std::path::{Path, PathBuf};

/// The kit's table, `deploy/harnesses/kit.txt`: each harness with its
/// installer, package and pinned version (install.sh and run.sh read it too).
pub const KIT_TABLE: &str = include_str!("../harnesses/kit.txt");

/// One row of the kit's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedHarness {
    pub name: &'static str,
    /// `npm` or `pip`.
    pub installer: &'static str,
    pub package: &'static str,
    pub version: &'static str,
}

/// The kit's harnesses in the table's order, without `node` (which the npm
/// harnesses run on).
pub fn pinned() -> impl Iterator<Item = PinnedHarness> {
    KIT_TABLE
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [name, installer, package, version] if name != "node" => Some(PinnedHarness {
                name,
                installer,
                package,
                version,
            }),
            _ => None,
        })
}

/// The kit's harness names, comma-separated (for help and errors).
pub fn kit_names() -> String {
    pinned().map(|h| h.name).collect::<Vec<_>>().join(", ")
}

/// Each name with its launch script, `deploy/harnesses/agents/NAME.sh`.
macro_rules! launch_scripts {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_str!(concat!("../harnesses/agents/", $name, ".sh")))),*]
    };
}

/// The kit's launch scripts, built in, in the table's order (a test holds
/// the two together).
pub const BUILTIN: [(&str, &str); 16] = launch_scripts![
    "claude-code",
    "codex",
    "opencode",
    "mini-swe-agent",
    "gemini-cli",
    "qwen-code",
    "pi",
    "aider",
    "openai-agents",
    "grok-cli",
    "continue-cli",
    "claude-agent-sdk",
    "cline",
    "pydantic-ai",
    "google-adk",
    "gptme",
];

/// Runs the task's reference solution instead of an agent.
pub const SOLVE: &str = "solve";

#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// A bash script, run in `/app`.
    Script(String),
    /// The task's `solution/solve.sh`, copied in first.
    Solution,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Harness {
    pub name: String,
    pub launch: Launch,
    /// The bundle it needs under the bundles directory, if any.
    pub bundle: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("unknown harness '{0}': one of {names}, solve, or a path to a launch script (NAME.sh)", names = kit_names())]
    Unknown(String),
    #[error("harness script {path}: {source}")]
    Script {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("harness {name}: its bundle is not installed in {dir}: scripts/sandbox-setup.sh installs every harness (deploy/harnesses/install.sh {name} this one)")]
    NoBundle { name: String, dir: PathBuf },
}

impl Harness {
    /// A built-in name, `solve`, or the path of a launch script (named by
    /// its file stem; its bundle, if any, is its own business).
    pub fn resolve(spec: &str) -> Result<Harness, HarnessError> {
        if spec == SOLVE {
            return Ok(Harness {
                name: SOLVE.into(),
                launch: Launch::Solution,
                bundle: None,
            });
        }
        if let Some((name, script)) = BUILTIN.iter().find(|(n, _)| *n == spec) {
            return Ok(Harness {
                name: name.to_string(),
                launch: Launch::Script(script.to_string()),
                bundle: Some(name.to_string()),
            });
        }
        let path = Path::new(spec);
        if path.extension().is_some_and(|e| e == "sh") {
            let script = std::fs::read_to_string(path).map_err(|source| HarnessError::Script {
                path: path.into(),
                source,
            })?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.into());
            return Ok(Harness {
                name,
                launch: Launch::Script(script),
                bundle: None,
            });
        }
        Err(HarnessError::Unknown(spec.into()))
    }

    /// SHA-256 (hex) of its launch script; `None` for `solve`.
    pub fn launch_script_sha256(&self) -> Option<String> {
        match &self.launch {
            Launch::Script(script) => Some(forgelog_schemas::content_hash(script.as_bytes())),
            Launch::Solution => None,
        }
    }

    /// Fails when this harness's bundle is missing from `bundles`.
    pub fn check_bundle(&self, bundles: &Path) -> Result<(), HarnessError> {
        match &self.bundle {
            Some(b) if !bundles.join(b).join(".forgelog-version").exists() => {
                Err(HarnessError::NoBundle {
                    name: self.name.clone(),
                    dir: bundles.join(b),
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_builtins_solve_or_scripts() {
        let codex = Harness::resolve("codex").unwrap();
        assert!(matches!(&codex.launch, Launch::Script(s) if s.contains("codex exec")));
        assert_eq!(Harness::resolve("solve").unwrap().launch, Launch::Solution);
        let aider = Harness::resolve("aider").unwrap();
        assert_eq!(aider.bundle.as_deref(), Some("aider"));
        assert!(matches!(
            Harness::resolve("cursor"),
            Err(HarnessError::Unknown(_))
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("my-agent.sh");
        std::fs::write(&path, "echo hi").unwrap();
        let mine = Harness::resolve(path.to_str().unwrap()).unwrap();
        assert_eq!(
            (mine.name.as_str(), mine.launch),
            ("my-agent", Launch::Script("echo hi".into()))
        );
        let err = codex.check_bundle(dir.path()).unwrap_err().to_string();
        assert!(err.contains("install.sh codex"), "{err}");
        let err = Harness::resolve("cursor").unwrap_err().to_string();
        assert!(err.contains("one of claude-code, codex,"), "{err}");
    }

    #[test]
    fn every_harness_of_the_table_has_its_launch_script_and_no_other() {
        let table: Vec<&str> = pinned().map(|h| h.name).collect();
        let built_in: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
        assert_eq!(table, built_in);
        for h in pinned() {
            assert!(["npm", "pip"].contains(&h.installer), "{h:?}");
            assert!(
                h.version.chars().next().is_some_and(|c| c.is_ascii_digit()),
                "{h:?}"
            );
        }
        let agents = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("harnesses/agents");
        let mut scripts: Vec<String> = std::fs::read_dir(agents)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        scripts.sort();
        let mut named: Vec<String> = table.iter().map(|n| format!("{n}.sh")).collect();
        named.sort();
        assert_eq!(
            scripts, named,
            "agents/ holds exactly the table's launch scripts"
        );
    }
}
