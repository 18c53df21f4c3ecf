//! Sandboxes as podman containers (runc; the settings that work on this
//! machine kind: explicit nofile/nproc limits). One container per rollout,
//! labelled with its run, rollout and attempt, kept alive by `sleep` while
//! the harness and the verifier run in it through `podman exec`.

use forgelog_deploy_core::Task;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use tokio::process::Command;

/// The label every forgelog sandbox carries (value: the run id).
pub const RUN_LABEL: &str = "forgelog.run";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "podman is not installed ({0}): scripts/sandbox-setup.sh installs it, with runc, \
         the tasks' base image and the harnesses"
    )]
    NoPodman(std::io::Error),
    #[error("podman {what}: {stderr}")]
    Podman { what: String, stderr: String },
    #[error(
        "task {task} builds FROM {image}, which is not in podman's local storage: \
         scripts/sandbox-setup.sh makes the shipped tasks' base image"
    )]
    NoBaseImage { task: String, image: String },
}

/// Where the container runs: the `podman` program with forgelog's settings.
#[derive(Debug, Clone)]
pub struct Podman {
    program: String,
}

impl Default for Podman {
    fn default() -> Podman {
        Podman {
            program: std::env::var("FORGELOG_PODMAN").unwrap_or_else(|_| "podman".into()),
        }
    }
}

/// What a sandbox is started with.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    pub name: String,
    /// (key, value) labels besides the run's.
    pub labels: Vec<(String, String)>,
    pub run_id: String,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    /// A network namespace to join (see `SandboxNetwork`); none: no network.
    pub netns: Option<String>,
    /// The nameserver its `/etc/resolv.conf` names (the network's resolver).
    pub dns: Option<std::net::Ipv4Addr>,
    /// Host paths mounted into the sandbox (harness bundles, task files).
    pub mounts: Vec<Mount>,
    /// `/etc/hosts` entries: (name, address), e.g. a Service name for the proxy.
    pub hosts: Vec<(String, String)>,
    /// The container is killed (and, started with `--rm`, removed) after
    /// this long whatever happens to its orchestrator.
    pub lifetime: Option<Duration>,
}

/// A host path in the sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub host: std::path::PathBuf,
    pub target: String,
    pub read_only: bool,
}

impl Mount {
    /// `dir` read-only at the same path (a bundle whose files name their own paths).
    pub fn same_path(dir: &Path) -> Mount {
        Mount {
            host: dir.to_path_buf(),
            target: dir.to_string_lossy().into_owned(),
            read_only: true,
        }
    }
}

/// How a command in the sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecEnd {
    /// Its exit code (`None`: killed by a signal).
    Exited(Option<i32>),
    TimedOut,
}

/// A command's end and what it printed.
#[derive(Debug, Clone)]
pub struct Exec {
    pub end: ExecEnd,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Podman {
    async fn podman(&self, what: &str, args: &[&str]) -> Result<Output, SandboxError> {
        let out = Command::new(&self.program)
            .arg("--runtime")
            .arg("runc")
            .args(args)
            .kill_on_drop(true)
            .output()
            .await
            .map_err(SandboxError::NoPodman)?;
        if !out.status.success() {
            return Err(SandboxError::Podman {
                what: what.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out)
    }

    /// Whether `image` is in local storage.
    pub async fn has_image(&self, image: &str) -> Result<bool, SandboxError> {
        let status = Command::new(&self.program)
            .args(["image", "exists", image])
            .status()
            .await
            .map_err(SandboxError::NoPodman)?;
        Ok(status.success())
    }

    /// Whether every image `tasks` build from that no registry serves is in
    /// local storage: checked before anything of a run starts.
    pub async fn check_base_images<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a Task>,
    ) -> Result<(), SandboxError> {
        for task in tasks {
            for image in task.local_base_images() {
                if !self.has_image(&image).await? {
                    return Err(SandboxError::NoBaseImage {
                        task: task.id.clone(),
                        image,
                    });
                }
            }
        }
        Ok(())
    }

    /// Builds `context` (a directory with a Dockerfile) as `tag`, never pulling:
    /// base images are local.
    pub async fn build(&self, context: &Path, tag: &str) -> Result<(), SandboxError> {
        let context = context.to_string_lossy();
        self.podman(
            &format!("build {tag}"),
            &["build", "--pull=never", "-q", "-t", tag, &context],
        )
        .await
        .map(|_| ())
    }

    /// Starts a sandbox of `image` with no network, idle until commands run in it.
    pub async fn start(&self, image: &str, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--rm",
            "--name",
            &spec.name,
            "--pids-limit",
            "1024",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["--label".into(), format!("{RUN_LABEL}={}", spec.run_id)]);
        args.extend([
            "--network".into(),
            match &spec.netns {
                Some(ns) => format!("ns:/run/netns/{ns}"),
                None => "none".into(),
            },
        ]);
        for m in &spec.mounts {
            let mode = if m.read_only { "ro" } else { "rw" };
            args.extend([
                "-v".into(),
                format!("{}:{}:{mode}", m.host.to_string_lossy(), m.target),
            ]);
        }
        if let Some(ip) = spec.dns {
            args.extend(["--dns".into(), ip.to_string()]);
        }
        for (name, addr) in &spec.hosts {
            args.extend(["--add-host".into(), format!("{name}:{addr}")]);
        }
        if let Some(t) = spec.lifetime {
            args.extend(["--timeout".into(), t.as_secs().max(1).to_string()]);
        }
        for (k, v) in &spec.labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        if let Some(c) = spec.cpus {
            args.extend(["--cpus".into(), c.to_string()]);
        }
        if let Some(m) = spec.memory_mb {
            args.extend(["--memory".into(), format!("{m}m")]);
        }
        args.extend([image.to_string(), "sleep".into(), "infinity".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.podman(&format!("run {}", spec.name), &args).await?;
        Ok(Sandbox {
            podman: self.clone(),
            name: spec.name.clone(),
        })
    }

    /// The runs that have sandboxes here, running or not.
    pub async fn runs(&self) -> Result<std::collections::BTreeSet<String>, SandboxError> {
        let format = format!("{{{{ index .Labels \"{RUN_LABEL}\" }}}}");
        let filter = format!("label={RUN_LABEL}");
        let out = self
            .podman(
                "ps",
                &["ps", "-a", "--filter", &filter, "--format", &format],
            )
            .await?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Removes every sandbox of `run` (the run's, when given; else all of
    /// forgelog's), running or not. Returns how many.
    pub async fn reap(&self, run: Option<&str>) -> Result<usize, SandboxError> {
        let filter = match run {
            Some(r) => format!("label={RUN_LABEL}={r}"),
            None => format!("label={RUN_LABEL}"),
        };
        let out = self
            .podman("ps", &["ps", "-a", "-q", "--filter", &filter])
            .await?;
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "--ignore", "-f", "-t", "0"];
            args.extend(ids.iter().map(String::as_str));
            self.podman("rm", &args).await?;
        }
        Ok(ids.len())
    }
}

/// A running container.
#[derive(Debug)]
pub struct Sandbox {
    podman: Podman,
    pub name: String,
}

impl Sandbox {
    /// Copies `host` (a file or a directory) to `dest` in the sandbox.
    pub async fn copy_in(&self, host: &Path, dest: &str) -> Result<(), SandboxError> {
        let parent = Path::new(dest)
            .parent()
            .map(|p| p.to_string_lossy().to_string())
            .unwrap_or_else(|| "/".into());
        self.podman
            .podman("exec", &["exec", &self.name, "mkdir", "-p", &parent])
            .await?;
        let to = format!("{}:{dest}", self.name);
        self.podman
            .podman("cp", &["cp", &host.to_string_lossy(), &to])
            .await
            .map(|_| ())
    }

    /// Runs `script` with bash in `workdir`, stopped after `timeout` (the
    /// process group inside is killed, not only `podman exec`).
    pub async fn exec(
        &self,
        script: &str,
        workdir: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<Exec, SandboxError> {
        let secs = format!("{}", timeout.as_secs_f64().max(1.0).ceil() as u64);
        let mut cmd = Command::new(&self.podman.program);
        cmd.args(["--runtime", "runc", "exec", "-w", workdir]);
        for (k, v) in env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.arg(&self.name)
            .args(["timeout", "-s", "KILL", &secs, "bash", "-c", script])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        // A margin over the in-sandbox timeout for podman itself.
        let out = tokio::time::timeout(timeout + Duration::from_secs(30), cmd.output())
            .await
            .map_err(|_| SandboxError::Podman {
                what: format!("exec in {}", self.name),
                stderr: "podman did not return".into(),
            })?
            .map_err(SandboxError::NoPodman)?;
        // `timeout -s KILL` exits 137 when it killed the command.
        let end = match out.status.code() {
            Some(137) => ExecEnd::TimedOut,
            code => ExecEnd::Exited(code),
        };
        Ok(Exec {
            end,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    /// The file at `path` in the sandbox, if it is there.
    pub async fn read(&self, path: &str) -> Result<Option<String>, SandboxError> {
        let out = Command::new(&self.podman.program)
            .args(["--runtime", "runc", "exec", &self.name, "cat", path])
            .output()
            .await
            .map_err(SandboxError::NoPodman)?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    pub async fn remove(self) -> Result<(), SandboxError> {
        self.podman
            .podman("rm", &["rm", "--ignore", "-f", "-t", "0", &self.name])
            .await
            .map(|_| ())
    }
}
