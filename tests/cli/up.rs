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
    // Read only what is written from now on: the shared topic may be large.
    let reader = forgelog_stream::ReplayReader::new(&config).unwrap();
    let starts: Vec<(i32, i64)> = reader
        .partitions("forgelog.calls")
        .unwrap()
        .into_iter()
        .map(|p| (p, reader.end("forgelog.calls", p).unwrap()))
        .collect();
    let (engine, proxy) = (free_local_addr(), free_local_addr());
    let mut child = forgelog()
        .args([
            "up",
            "--brokers",
            &config.brokers,
            "--run",
            &run,
            "--engine-listen",
            &engine.to_string(),
            "--proxy-listen",
            &proxy.to_string(),
            "--home",
        ])
        .arg(home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    while !printed.contains("(Ctrl-C to stop)") {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "up exited early: {printed}"
        );
        printed.push_str(&line);
    }
    let key = printed
        .lines()
        .find(|l| l.contains("OPENAI_API_KEY="))
        .and_then(|l| l.split("OPENAI_API_KEY=").nth(1))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        printed.matches(&format!("http://{proxy}")).count(),
        4,
        "{printed}"
    );

    let answer: serde_json::Value = rt.block_on(async {
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
    });
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("Paris"), "{answer}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());

    let mut finished = Vec::new();
    for (partition, from) in starts {
        let end = reader.end("forgelog.calls", partition).unwrap();
        let _ = reader.for_each_in("forgelog.calls", partition, from, end, |r| {
            if let Ok(Event::CallFinished(c)) = r.event {
                if c.run_id == run {
                    finished.push(c);
                }
            }
            std::ops::ControlFlow::Continue(())
        });
    }
    assert_eq!(finished.len(), 1);
    let c = &finished[0];
    assert!(c.trainable, "{:?}", c.untrainable_reason);
    assert!(!c.prompt_token_ids.is_empty() && !c.completion_token_ids.is_empty());
    assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
    assert!(c.completion_logprobs.iter().all(|&l| l <= 0.0));
    assert_eq!(c.policy_version, Some(0));
    assert!(c.chat_response.contains("Paris"), "{}", c.chat_response);
}

/// An engine that cannot start (here: no such model; on a CPU build, `--device
/// cuda` the same way) used to leave `up` waiting two minutes for its health
/// check. It says why and exits at once.
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
