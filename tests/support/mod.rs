//! Shared by the `forgelog` binary's tests.
#![allow(dead_code)]

pub mod gradient;
pub mod kit;
pub mod sandboxes;
pub mod vllm;

use forgelog_stream::testing::{python_json, python_json_with, torch_venv_python};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Loads an SFT JSONL export with Hugging Face `datasets` (offline, as a user
/// would); returns `{"rows", "columns", "roles"}` (the roles of row 0).
pub fn load_with_datasets(jsonl: &Path) -> serde_json::Value {
    load_sft(&[jsonl.to_str().unwrap()])
}

/// Loads config `config` of the export in `dir` (its dataset card) with
/// `datasets.load_dataset(dir, config)`; returns as [`load_with_datasets`].
pub fn load_export_config(dir: &Path, config: &str) -> serde_json::Value {
    load_sft(&[dir.to_str().unwrap(), config])
}

fn load_sft(args: &[&str]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/load_sft.py");
    let cache = tempfile::tempdir().unwrap();
    let mut args = args.to_vec();
    args.push(cache.path().to_str().unwrap());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(python_json(&script, &args))
}

/// The recorded SmolLM2 run (replay-tests' fixture) under run id `run`, with
/// the trajectories and batches the consumers derive from it, in log order.
pub fn recorded(run: &str) -> Vec<forgelog_schemas::Event> {
    use forgelog_consumers::{rebuild::rebuild, RewardConfig};
    use forgelog_schemas::Event;
    let relabel = |e: &Event| {
        let mut v = serde_json::to_value(e).unwrap();
        v["run_id"] = run.into();
        serde_json::from_value::<Event>(v).unwrap()
    };
    let inputs: Vec<Event> = forgelog_replay_tests::fixture()
        .unwrap()
        .iter()
        .map(relabel)
        .collect();
    let derived = rebuild(
        &forgelog_replay_tests::by_topic(&inputs),
        RewardConfig::default(),
    );
    [inputs, derived.trajectories, derived.batches].concat()
}

/// The shipped task set.
pub fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/tasks")
}

/// Sandboxes of `run` still there, running or not.
pub fn containers_of(run: &str) -> usize {
    let out = Command::new("podman")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=forgelog.run={run}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count()
}

/// A copy of the shipped `hello-file` task as `root/name`, with `file` replaced by `text`.
pub fn variant(root: &Path, name: &str, file: &str, text: &str) {
    let dir = root.join(name);
    let from = shipped().join("hello-file");
    for sub in ["", "environment", "tests", "solution"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for f in [
        "instruction.md",
        "task.toml",
        "environment/Dockerfile",
        "tests/test.sh",
        "solution/solve.sh",
    ] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join(file), text).unwrap();
}

/// Variants of `hello-file` under `root` that fail each their own way:
/// `wrong-answer` (reward 0), `verifier-crashes`, `reward-missing`,
/// `reward-nan`, `agent-hangs` (a 2 s agent timeout) and `image-missing`.
pub fn faulty_variants(root: &Path) {
    let r = root;
    variant(
        r,
        "wrong-answer",
        "solution/solve.sh",
        "echo 'Hello?' > /app/hello.txt\n",
    );
    variant(r, "verifier-crashes", "tests/test.sh", "exit 3\n");
    variant(r, "reward-missing", "tests/test.sh", "true\n");
    variant(
        r,
        "reward-nan",
        "tests/test.sh",
        "echo NaN > /logs/verifier/reward.txt\n",
    );
    variant(r, "agent-hangs", "solution/solve.sh", "sleep 600\n");
    let toml = std::fs::read_to_string(shipped().join("hello-file/task.toml")).unwrap();
    std::fs::write(
        r.join("agent-hangs/task.toml"),
        toml.replace("timeout_sec = 300.0", "timeout_sec = 2.0"),
    )
    .unwrap();
    variant(
        r,
        "image-missing",
        "task.toml",
        &format!("{toml}docker_image = \"localhost/forgelog-no-such-image\"\n"),
    );
}

/// Writes `policy` to `dir` as a Hugging Face model folder: what every
/// checkpoint carries (`forgelog_model::hf`) and its weights.
pub fn write_hf_model_folder(policy: &forgelog_model::Policy, dir: &Path) {
    for (name, bytes) in forgelog_model::hf::folder_files(policy, "float32").unwrap() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    candle_core::safetensors::save(&policy.weights, dir.join("model.safetensors")).unwrap();
}

/// Reads the model folder `dir` as the Hugging Face ecosystem does
/// (`tests/python/hf_model_check.py`, in the torch venv: transformers'
/// config, tokenizer with its chat template, and AutoModelForCausalLM) and checks it
/// against `policy` as forgelog serves it: the same prompt ids for a chat
/// (one whose earlier answer thought aloud, which a Qwen3 template drops) and
/// the same logits at every position. Returns what the check printed.
pub fn check_hf_model_folder(dir: &Path, policy: &forgelog_model::Policy) -> serde_json::Value {
    let messages = vec![
        serde_json::json!({"role": "system", "content": "You are a helpful assistant."}),
        serde_json::json!({"role": "user", "content": "What is the capital of France?"}),
        serde_json::json!({"role": "assistant", "content": "<think>\nA capital.\n</think>\n\nParis."}),
        serde_json::json!({"role": "user", "content": "And of Italy?"}),
    ];
    let text = policy.chat_template.render(&messages, None, true).unwrap();
    let ids = policy
        .tokenizer
        .encode(text, false)
        .unwrap()
        .get_ids()
        .to_vec();
    let logits = policy
        .model
        .forward(&ids, &mut forgelog_model::KvCache::new())
        .unwrap();
    let logits: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    let expected = tempfile::NamedTempFile::new().unwrap();
    let body = serde_json::json!({"messages": messages, "prompt_ids": ids, "logits": logits});
    std::fs::write(expected.path(), body.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hf_model_check.py");
    let args = [dir.to_str().unwrap(), expected.path().to_str().unwrap()];
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(python_json_with(&torch_venv_python(), &script, &args))
}

/// The run directories (`$FORGELOG_HOME/runs/R` and `R.replay`) of the runs a
/// test starts, removed once it passes: each holds its attempts' output and,
/// when it trains, gigabytes of checkpoints. Left in place by a failing test,
/// for whoever looks into it. (Found by CI: 15 GB of them, left by earlier
/// runs of the suite, filled the disk and a learner's checkpoint write failed.)
#[derive(Default)]
pub struct RunDirs(std::sync::Mutex<Vec<String>>);

impl RunDirs {
    pub fn add(&self, run: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(run.to_string());
    }
}

impl Drop for RunDirs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let runs = forgelog_stream::forgelog_home().join("runs");
        for run in self.0.get_mut().unwrap_or_else(|p| p.into_inner()).iter() {
            for dir in [run.clone(), format!("{run}.replay")] {
                let _ = std::fs::remove_dir_all(runs.join(dir));
            }
        }
    }
}

/// Runs `cmd` to its end, or for `limit` at most: then it is interrupted
/// (SIGINT: it stops as on Ctrl-C, saying what it was doing) and killed 20 s
/// later. Its output either way, and whether it ran out of time: a test that
/// waits on a hung process prints what the process said, where the test
/// runner's own timeout would kill both and keep nothing of it.
pub fn output_within(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> (std::process::Output, bool) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = std::time::Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        let waited = started.elapsed();
        if waited > limit && !timed_out {
            timed_out = true;
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
        }
        if waited > limit + std::time::Duration::from_secs(20) {
            let _ = child.kill();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (output, timed_out)
}
