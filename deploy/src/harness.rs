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

/// The eight harnesses the kit installs (`deploy/harnesses/install.sh`).
pub const BUILTIN: [(&str, &str); 13] = [
    (
        "claude-code",
        include_str!("../harnesses/agents/claude-code.sh"),
    ),
    ("codex", include_str!("../harnesses/agents/codex.sh")),
    ("opencode", include_str!("../harnesses/agents/opencode.sh")),
    (
        "mini-swe-agent",
        include_str!("../harnesses/agents/mini-swe-agent.sh"),
    ),
    (
        "gemini-cli",
        include_str!("../harnesses/agents/gemini-cli.sh"),
    ),
    (
        "qwen-code",
        include_str!("../harnesses/agents/qwen-code.sh"),
    ),
    ("pi", include_str!("../harnesses/agents/pi.sh")),
    ("aider", include_str!("../harnesses/agents/aider.sh")),
    (
        "openai-agents",
        include_str!("../harnesses/agents/openai-agents.sh"),
    ),
    ("grok-cli", include_str!("../harnesses/agents/grok-cli.sh")),
    (
        "continue-cli",
        include_str!("../harnesses/agents/continue-cli.sh"),
    ),
    (
        "claude-agent-sdk",
        include_str!("../harnesses/agents/claude-agent-sdk.sh"),
    ),
    ("cline", include_str!("../harnesses/agents/cline.sh")),
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
    #[error("unknown harness '{0}': one of claude-code, codex, opencode, mini-swe-agent, gemini-cli, qwen-code, pi, aider, openai-agents, grok-cli, continue-cli, claude-agent-sdk, cline, solve, or a path to a launch script (NAME.sh)")]
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
    }
}
