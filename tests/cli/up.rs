//! `forgelog up`: a call through its engine and proxy recorded, and what
//! it refuses at start.

use super::*;

/// `forgelog up` end to end: the real engine (SmolLM2) behind the proxy; one
/// OpenAI-dialect call lands in the log with the tokens the engine sampled.
#[test]
fn up_serves_a_recorded_call_through_engine_and_proxy() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let home = tempfile::tempdir().unwrap();
    let run = unique_run_id("up");
    let calls = CallsFromNow::of(&config);
    let (engine, proxy) = (free_local_addr(), free_local_addr());
    let (mut child, printed) = up_ready(
        &[
            "--brokers",
            &config.brokers,
            "--run",
            &run,
            "--engine-listen",
            &engine.to_string(),
        ],
        proxy,
        home.path(),
    );
    assert_eq!(
        printed.matches(&format!("http://{proxy}")).count(),
        4,
        "{printed}"
    );
    let answer = ask_capital(&rt, proxy, &printed);
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("Paris"), "{answer}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());

    let finished = calls.of_run(&run);
    assert_eq!(finished.len(), 1);
    let c = &finished[0];
    assert!(c.trainable, "{:?}", c.untrainable_reason);
    assert!(!c.prompt_token_ids.is_empty() && !c.completion_token_ids.is_empty());
    assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
    assert!(c.completion_logprobs.iter().all(|&l| l <= 0.0));
    assert_eq!(c.policy_version, Some(0));
    assert!(c.chat_response.contains("Paris"), "{}", c.chat_response);
}

/// Training through an engine of its own (`--upstream`), the proxy renders
/// prompts with the learner's model (token in) unless told otherwise, and an
/// engine serving another model is refused at start: before, the engine
/// rendered each call afresh (a multi-turn rollout trained as fragments) and
/// a learner could train a model the engine did not serve, on its ids.
#[test]
fn up_train_through_an_engine_renders_with_the_learners_model_and_refuses_another() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("up-upstream");
    let listen = free_local_addr();
    let mut engine = forgelog()
        .args(["engine", "--listen", &listen.to_string()])
        .args(["--brokers", &config.brokers, "--run", &run])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let upstream = format!("http://{listen}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rt
        .block_on(reqwest::get(format!("{upstream}/v1/models")))
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no engine at {upstream}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let through = [
        "--train",
        "--brokers",
        &config.brokers,
        "--run",
        &run,
        "--upstream",
        &upstream,
    ];

    let other = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama(other.path(), 3).unwrap();
    let mut refused = through.to_vec();
    refused.extend(["--model", other.path().to_str().unwrap()]);
    let err = up_fails(&refused);
    assert!(
        err.contains("token in: the proxy's chat template and tokenizer render a probe conversation otherwise than the engine")
            && err.contains("does the engine serve the model the proxy renders for?"),
        "{err}"
    );

    let calls = CallsFromNow::of(&config);
    let home = tempfile::tempdir().unwrap();
    let proxy = free_local_addr();
    let (mut up, printed) = up_ready(&through, proxy, home.path());
    ask_capital(&rt, proxy, &printed);
    sigterm(&up);
    let stopped = up.wait().unwrap();
    let said = std::fs::read_to_string(home.path().join("up.stderr"));
    assert!(stopped.success(), "{said:?}");
    engine.kill().unwrap();
    engine.wait().unwrap();
    let finished = calls.of_run(&run);
    assert_eq!(finished.len(), 1);
    let made = finished[0].prompt_made.as_ref().expect("token in");
    assert_eq!(made.spliced_from, None, "the session's first call");
}

/// `forgelog up ARGS` with its proxy on `proxy` and its state in `home`,
/// once it has printed its session keys: the process and what it printed.
fn up_ready(
    args: &[&str],
    proxy: std::net::SocketAddr,
    home: &std::path::Path,
) -> (std::process::Child, String) {
    let mut child = forgelog()
        .arg("up")
        .args(args)
        .args(["--proxy-listen", &proxy.to_string(), "--home"])
        .arg(home)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(home.join("up.stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    while !printed.contains("(Ctrl-C to stop)") {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let said = std::fs::read_to_string(home.join("up.stderr"));
            panic!("up exited early: {printed}{said:?}");
        }
        printed.push_str(&line);
    }
    (child, printed)
}

/// One OpenAI-dialect call through `up`'s proxy with the session key it
/// printed: the answer.
fn ask_capital(
    rt: &tokio::runtime::Runtime,
    proxy: std::net::SocketAddr,
    printed: &str,
) -> serde_json::Value {
    let key = printed
        .lines()
        .find(|l| l.contains("OPENAI_API_KEY="))
        .and_then(|l| l.split("OPENAI_API_KEY=").nth(1))
        .unwrap()
        .trim()
        .to_string();
    rt.block_on(async {
        reqwest::Client::new()
            .post(format!("http://{proxy}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8, "temperature": 0}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

/// The calls written to the shared log from now on (read from where each
/// partition ends now: the shared topic may be large).
struct CallsFromNow {
    reader: forgelog_stream::ReplayReader,
    starts: Vec<(i32, i64)>,
}

impl CallsFromNow {
    fn of(config: &forgelog_stream::StreamConfig) -> CallsFromNow {
        let reader = forgelog_stream::ReplayReader::new(config).unwrap();
        let starts = reader
            .partitions("forgelog.calls")
            .unwrap()
            .into_iter()
            .map(|p| (p, reader.end("forgelog.calls", p).unwrap()))
            .collect();
        CallsFromNow { reader, starts }
    }

    /// The calls of `run` finished since.
    fn of_run(&self, run: &str) -> Vec<forgelog_schemas::CallFinished> {
        let mut finished = Vec::new();
        for &(partition, from) in &self.starts {
            let end = self.reader.end("forgelog.calls", partition).unwrap();
            let _ = self
                .reader
                .for_each_in("forgelog.calls", partition, from, end, |r| {
                    if let Ok(Event::CallFinished(c)) = r.event {
                        if c.run_id == run {
                            finished.push(c);
                        }
                    }
                    std::ops::ControlFlow::Continue(())
                });
        }
        finished
    }
}

/// `forgelog up ARGS` on free ports in a home of its own, which must fail:
/// what it said.
fn up_fails(args: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = forgelog()
        .arg("up")
        .args(args)
        .args(["--engine-listen", &free_local_addr().to_string()])
        .args(["--proxy-listen", &free_local_addr().to_string(), "--home"])
        .arg(home.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    err
}

/// An engine that cannot start (here: no such model; on a CPU build, `--device
/// cuda` the same way) used to leave `up` waiting two minutes for its health
/// check. It says why and exits at once.
#[test]
fn up_with_an_engine_that_cannot_start_says_why_at_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let started = std::time::Instant::now();
    let err = up_fails(&[
        "--brokers",
        &config.brokers,
        "--model",
        "/nowhere/model.gguf",
    ]);
    assert!(
        err.contains("/nowhere/model.gguf") && err.contains("did not start"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

/// An upstream that does not say which policy it serves (vLLM) would never
/// load the learner's versions: `up --train` refuses it, saying why.
#[test]
fn up_train_refuses_an_upstream_that_does_not_load_published_versions() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let (upstream, _) = rt
        .block_on(forgelog_producers::fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let upstream = format!("http://{upstream}");
    let err = up_fails(&[
        "--train",
        "--brokers",
        &config.brokers,
        "--upstream",
        &upstream,
    ]);
    assert!(
        err.contains("does not report the policy version")
            && err.contains("forgelog engine --brokers"),
        "{err}"
    );
}
