//! Object storage, on moto's S3-compatible server (PyPI `moto[server]`, started
//! here): `forgelog export sft` of the recorded SmolLM2 run (replay-tests'
//! fixture) to a plain path, to `file://` and to `s3://` (the S3 objects are
//! byte-for-byte the files, and every JSONL split loads with Hugging Face
//! `datasets`); and `forgelog engine` reloading a checkpoint from `s3://` with
//! the environment's credentials and endpoint, as the trainer writes them.

mod support;

use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_replay_tests::{by_topic, decode, fixture_dir, RUN};
use forgelog_stream::testing::{self, venv_python, PrivateBroker};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const BUCKET: &str = "forgelog-exports";

/// A child process (moto's server, an engine), killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> (Killed, String) {
    let addr = testing::free_local_addr();
    let child = Command::new(venv_python())
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
        .arg(addr.port().to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto server (scripts/python-env.sh)");
    let moto = Killed(child);
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "moto did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (moto, format!("http://{addr}"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The AWS variables that point a process at moto.
fn aws_env<'a>(cmd: &'a mut Command, endpoint: &str) -> &'a mut Command {
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
}

fn s3_tool(endpoint: &str, args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/s3.py");
    run(Command::new(venv_python())
        .arg(script)
        .arg(endpoint)
        .args(args))
}

/// Every file under `dir`, by relative path.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn s3_export_is_byte_identical_to_the_file_export_and_loads_with_datasets() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let inputs = decode(&std::fs::read(fixture_dir().join("events.bin")).unwrap()).unwrap();
    let derived = rebuild(&by_topic(&inputs), RewardConfig::default());
    let events = [inputs, derived.trajectories, derived.batches].concat();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(testing::produce(&config, &events));
    let (_moto, endpoint) = start_moto();
    s3_tool(&endpoint, &["mkbucket", BUCKET]);

    let export = |to: &str| {
        run(aws_env(
            Command::new(env!("CARGO_BIN_EXE_forgelog"))
                .args(["export", "sft", "--run", RUN, "--to", to, "--brokers"])
                .arg(&config.brokers),
            &endpoint,
        ))
    };
    let local = tempfile::tempdir().unwrap();
    let file_out = export(&format!("file://{}", local.path().display()));
    let plain = tempfile::tempdir().unwrap();
    export(&plain.path().join("out").display().to_string());
    assert_eq!(files(&plain.path().join("out")), files(local.path()));
    let s3_out = export(&format!("s3://{BUCKET}/runs/{RUN}"));
    let listed = |o: &Output| String::from_utf8_lossy(&o.stdout).lines().count();
    assert_eq!(listed(&file_out), listed(&s3_out));

    let fetched = tempfile::tempdir().unwrap();
    let keys = s3_tool(
        &endpoint,
        &[
            "download",
            BUCKET,
            &format!("runs/{RUN}"),
            fetched.path().to_str().unwrap(),
        ],
    );
    let keys: Vec<String> = serde_json::from_slice(&keys.stdout).unwrap();
    let (from_file, from_s3) = (files(local.path()), files(fetched.path()));
    assert_eq!(keys.len(), from_file.len());
    assert!(
        from_file.contains_key(Path::new("manifest.json")),
        "{:?}",
        from_file.keys()
    );
    assert_eq!(
        from_file.keys().collect::<Vec<_>>(),
        from_s3.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &from_file {
        assert!(bytes == &from_s3[path], "{} differs on S3", path.display());
    }

    // Every JSONL split loads with HF datasets, with the manifest's row count.
    let manifest: serde_json::Value =
        serde_json::from_slice(&from_file[Path::new("manifest.json")]).unwrap();
    let jsonl: Vec<&PathBuf> = from_file
        .keys()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert_eq!(jsonl.len(), 2, "one split per harness: {jsonl:?}");
    for p in jsonl {
        let harness = p.parent().unwrap().to_str().unwrap();
        let loaded = support::load_with_datasets(&local.path().join(p));
        assert_eq!(loaded["rows"], manifest["jsonl_rows"][harness], "{loaded}");
        assert!(
            loaded["columns"]
                .as_array()
                .unwrap()
                .contains(&"messages".into()),
            "{loaded}"
        );
        assert_eq!(loaded["roles"][0], "system", "{loaded}");
    }

    // The manifest and the card name the model that sampled and its versions
    // (whose model folders hold the tokenizer and chat template).
    assert_eq!(
        manifest["models"],
        serde_json::json!(["SmolLM2-135M-Instruct"]),
        "{manifest}"
    );
    let versions = manifest["policy_versions"].as_array().unwrap();
    assert!(!versions.is_empty(), "{manifest}");
    let card = String::from_utf8(from_file[Path::new("README.md")].clone()).unwrap();
    assert!(
        card.contains("Sampled by `SmolLM2-135M-Instruct`: policy versions 0; "),
        "{card}"
    );

    // The dataset card: each harness a config of the tokenized Parquet, `all`
    // the default.
    let harnesses: Vec<&String> = manifest["rows"].as_object().unwrap().keys().collect();
    let mut total = 0;
    for harness in &harnesses {
        let tokens = support::load_export_config(local.path(), harness);
        assert_eq!(tokens["rows"], manifest["rows"][harness], "{tokens}");
        total += tokens["rows"].as_u64().unwrap();
        for column in [
            "row_id",
            "input_ids",
            "assistant_masks",
            "labels",
            "reward",
            "advantage",
            "sampling_logprobs",
            "policy_versions",
            "harness",
            "task_id",
        ] {
            assert!(
                tokens["columns"]
                    .as_array()
                    .unwrap()
                    .contains(&column.into()),
                "{column}: {tokens}"
            );
        }
    }
    let all = support::load_export_config(local.path(), "all");
    assert_eq!(all["rows"].as_u64().unwrap(), total, "{all}");
    // Every conversation renders with the recording model's own template (as
    // TRL's SFTTrainer renders it), and where the tokens are not the recorded
    // ones the check says where.
    let model = tempfile::tempdir().unwrap();
    let policy = forgelog_model::load_policy(
        "smollm2",
        &forgelog_stream::models_dir(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    support::write_hf_model_folder(&policy, model.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/sft_template_check.py");
    for harness in &harnesses {
        let jsonl = local.path().join(harness).join("sft.jsonl");
        let args = [model.path().to_str().unwrap(), jsonl.to_str().unwrap()];
        let checked = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(forgelog_stream::testing::python_json(&script, &args));
        eprintln!("{harness} rendered by SmolLM2's template: {checked}");
        assert_eq!(checked["rendered"], manifest["jsonl_rows"][*harness]);
        let differing = checked["differences"].as_array().unwrap().len() as u64;
        assert_eq!(
            checked["same_tokens"].as_u64().unwrap() + differing,
            checked["rows"].as_u64().unwrap()
        );
    }

    // TRL's SFTTrainer trains a step on each harness's export, as a user
    // would load it: the JSONL's messages through the model's own template,
    // and the Parquet's recorded tokens as they are.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/trl_sft_step.py");
    for harness in &harnesses {
        let args = [
            model.path().to_str().unwrap(),
            local.path().to_str().unwrap(),
            harness,
        ];
        let stepped = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(testing::python_json_with(
                &testing::torch_venv_python(),
                &script,
                &args,
            ));
        eprintln!("{harness}: a TRL SFTTrainer step: {stepped}");
        for (form, rows) in [("messages", "jsonl_rows"), ("tokens", "rows")] {
            assert_eq!(stepped[form]["steps"], 1, "{stepped}");
            assert_eq!(stepped[form]["rows"], manifest[rows][*harness], "{stepped}");
            assert!(stepped[form]["loss"].as_f64().unwrap() > 0.0, "{stepped}");
        }
        // The Parquet's labels train only what the model sampled; the
        // template's render trains every token of the conversation.
        assert!(
            stepped["tokens"]["loss_tokens_first_batch"].as_u64()
                < stepped["messages"]["loss_tokens_first_batch"].as_u64(),
            "{stepped}"
        );
    }

    // The RL export of the same run: every path, and preference data from
    // the groups whose rewards differ, each line what TRL's trainers read.
    let rl = tempfile::tempdir().unwrap();
    run(Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["export", "rl", "--run", RUN, "--to"])
        .arg(rl.path())
        .arg("--brokers")
        .arg(&config.brokers));
    let rl_files = files(rl.path());
    let rl_manifest: serde_json::Value =
        serde_json::from_slice(&rl_files[Path::new("manifest.json")]).unwrap();
    assert_eq!(rl_manifest["kind"], "rl");
    eprintln!("RL export: {rl_manifest}");
    for harness in &harnesses {
        let paths = support::load_export_config(rl.path(), harness);
        assert_eq!(paths["rows"], rl_manifest["rows"][harness], "{paths}");
    }
    for (file, keys, count) in [
        (
            "dpo.jsonl",
            &["prompt", "chosen", "rejected"][..],
            "dpo_pairs",
        ),
        (
            "kto.jsonl",
            &["prompt", "completion", "label"][..],
            "kto_examples",
        ),
    ] {
        let text = String::from_utf8(rl_files[Path::new(file)].clone()).unwrap();
        assert_eq!(
            text.lines().count() as u64,
            rl_manifest[count].as_u64().unwrap()
        );
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for key in keys {
                assert!(!v[key].is_null(), "{key} in {line}");
            }
        }
    }
    assert!(
        rl_manifest["dpo_pairs"].as_u64().unwrap() > 0,
        "the fixture's groups have reward variance: {rl_manifest}"
    );

    // The manifest's checksums are the files'.
    for (name, sum) in manifest["sha256"].as_object().unwrap() {
        use sha2::Digest;
        let bytes = &from_file[Path::new(name)];
        assert_eq!(sum, &format!("{:x}", sha2::Sha256::digest(bytes)), "{name}");
    }
}

/// What the trainer writes to S3 the engine reloads, with the credentials and
/// endpoint of its environment (as object_store's S3 client reads them).
#[test]
fn the_engine_reloads_a_checkpoint_from_s3() {
    let (_moto, endpoint) = start_moto();
    s3_tool(&endpoint, &["mkbucket", BUCKET]);
    let dir = tempfile::tempdir().unwrap();
    let config = forgelog_model::testing::write_tiny_llama(&dir.path().join("model"), 5).unwrap();
    let mut weights = forgelog_model::testing::tiny_weights(&config, 5);
    let scaled = weights["lm_head.weight"].affine(1.5, 0.0).unwrap();
    weights.insert("lm_head.weight".into(), scaled);
    let file = dir.path().join("model.safetensors");
    candle_core::safetensors::save(&weights, &file).unwrap();
    let key = "checkpoints/run/v000003/model.safetensors";
    s3_tool(&endpoint, &["upload", BUCKET, key, file.to_str().unwrap()]);

    let listen = testing::free_local_addr();
    let engine = aws_env(
        Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(["engine", "--listen", &listen.to_string(), "--model"])
            .arg(dir.path().join("model"))
            .args(["--admin-token", "engine-admin"])
            .args(["--checkpoint-root", &format!("s3://{BUCKET}/checkpoints/")]),
        &endpoint,
    )
    .spawn()
    .unwrap();
    let _engine = Killed(engine);
    let base = format!("http://{listen}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    rt.block_on(async {
        let started = Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "engine did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reload = |uri: String, version: u64| {
            let http = http.clone();
            let url = format!("{base}/admin/reload");
            async move {
                let body = serde_json::json!({"checkpoint_uri": uri, "version": version});
                let r = http
                    .post(url)
                    .bearer_auth("engine-admin")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                (
                    r.status().as_u16(),
                    r.json::<serde_json::Value>().await.unwrap(),
                )
            }
        };
        let (status, body) = reload(format!("s3://{BUCKET}/{key}"), 3).await;
        assert_eq!(
            (status, &body["policy_version"]),
            (200, &serde_json::json!(3)),
            "{body}"
        );
        // A key that is not there: a clean 400 naming it, the policy unchanged.
        let (status, body) = reload(
            format!("s3://{BUCKET}/checkpoints/nope/model.safetensors"),
            4,
        )
        .await;
        assert_eq!(status, 400, "{body}");
        let models: serde_json::Value = http
            .get(format!("{base}/v1/models"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["policy_version"], 3);
    });
}

/// `forgelog export atif`: every rollout of the recorded SmolLM2 run is one
/// trajectory that Harbor's own ATIF models load, and every sampled turn in it
/// carries the exact token ids and logprobs the log recorded.
#[test]
fn atif_export_loads_with_harbors_models_and_keeps_every_sampled_token() {
    use forgelog_schemas::Event;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(testing::shared_broker());
    let run_id = testing::unique_run_id("atif");
    let events = support::recorded(&run_id);
    rt.block_on(testing::produce(&config, &events));
    let out_dir = tempfile::tempdir().unwrap();
    let to = out_dir.path().join("atif");
    run(Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "export",
            "atif",
            "--run",
            &run_id,
            "--brokers",
            &config.brokers,
            "--to",
        ])
        .arg(&to));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/atif_check.py");
    let checked = rt.block_on(testing::python_json(&script, &[to.to_str().unwrap()]));
    let docs = checked.as_object().unwrap();

    let mut rollouts = BTreeMap::new();
    let mut rewards = BTreeMap::new();
    for e in &events {
        match e {
            Event::RolloutStarted(s) => {
                rollouts.insert(s.rollout_id.clone(), s.harness.clone());
            }
            Event::TrainingBatch(b) => {
                for m in &b.members {
                    rewards.insert(m.rollout_id.clone(), m.reward);
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        docs.len(),
        rollouts.len(),
        "one trajectory per rollout: {checked}"
    );
    for e in &events {
        let Event::CallFinished(c) = e else { continue };
        let doc = &docs[&format!("{}/{}", rollouts[&c.rollout_id], c.rollout_id)];
        assert_eq!(doc["schema_version"], "ATIF-v1.7");
        assert_eq!(doc["sources"][0], "system", "{doc}");
        let turn = doc["sampled"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["call_index"] == c.call_index)
            .unwrap_or_else(|| panic!("call {} of {} not in {doc}", c.call_index, c.rollout_id));
        let ids: Vec<u32> = serde_json::from_value(turn["completion_token_ids"].clone()).unwrap();
        assert_eq!(ids, c.completion_token_ids);
        let logprobs: Vec<f32> = serde_json::from_value(turn["logprobs"].clone()).unwrap();
        assert_eq!(logprobs, c.completion_logprobs);
        assert_eq!(turn["prompt_tokens"], c.prompt_token_ids.len());
        assert_eq!(doc["reward"], serde_json::json!(rewards[&c.rollout_id]));
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(to.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["kind"], "atif");
    let listed: u64 = manifest["rows"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(listed as usize, rollouts.len());
}
