//! `forgelog run --train`: the learner in the run's process, on the tiny
//! llama (the loop, versions, a failing learner) and on SmolLM2 (a step's
//! direction through forgelog's engine).

use crate::support;
use crate::support::gradient::{
    a_group_with_variance, assert_learner_reads_the_choices, events_of, published,
    teacher_forced_by, tool_call_grammar, trajectories, LogprobMoves, CHECK_LEARNING_RATE,
    HELLO_FILE_COMMANDS,
};
use crate::support::sandboxes::{output_timed, run_dir, slots_of, stderr_of};
use crate::support::{shipped, variant};
use forgelog_schemas::{CallStatus, Event, Topic, VerifierResult};
use forgelog_stream::testing::{shared_broker, unique_run_id};
use forgelog_stream::StreamConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `forgelog run --train` of run `run` on the tiny llama in `model`:
/// mini-swe-agent on `tasks` (shipped), two rollouts each, two calls each,
/// every answer a `bash` tool call running one of [`HELLO_FILE_COMMANDS`]
/// (forgelog's engine takes vLLM's `structured_outputs`), on policy (a step
/// per group, `--max-staleness 0`).
fn train_command(run: &str, model: &Path, stream: &StreamConfig, tasks: &[&str]) -> Command {
    train_command_in(&shipped(), run, model, stream, tasks)
}

/// [`train_command`] over the tasks of `dir`.
fn train_command_in(
    dir: &Path,
    run: &str,
    model: &Path,
    stream: &StreamConfig,
    tasks: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forgelog"));
    cmd.arg("run")
        .arg(dir)
        .args(["--harness", "mini-swe-agent", "--run", run]);
    for task in tasks {
        cmd.args(["--task", task]);
    }
    cmd.args(["--group-size", "2", "--concurrency", "4"])
        .args(["--max-model-calls", "2", "--max-tokens", "160"])
        .args([
            "--extra-body",
            &tool_call_grammar("bash", "command", HELLO_FILE_COMMANDS),
        ])
        .args(["--brokers", &stream.brokers])
        .arg("--model")
        .arg(model)
        .args(["--train", "--groups-per-step", "1", "--max-staleness", "0"]);
    cmd
}

/// `forgelog run --train`: mini-swe-agent in its sandboxes, sampled by the
/// embedded engine (a tiny llama), the consumers and the learner in the same
/// process. On policy (`--max-staleness 0`, a step per group), the second
/// group starts only once the engine serves the version trained on the first:
/// versions advance, one per group, and each group's calls are served by the
/// version made from the groups before it.
#[test]
fn a_training_run_closes_the_loop_through_a_real_harness() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let run = unique_run_id("run-train");
    let run_dirs = support::RunDirs::default();
    run_dirs.add(&run);
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama_with_context(model.path(), 13, 8192).unwrap();
    let mut train = train_command(&run, model.path(), &stream, &["count-lines", "hello-file"]);
    let out = output_timed(
        train.args(["--learning-rate", "1e-3"]),
        "forgelog run --train",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));

    let read = |topic: Topic| events_of(&stream, topic, &run);
    let versions: Vec<i64> = read(Topic::Policy)
        .iter()
        .filter_map(|e| match e {
            Event::PolicyPublished(p) => Some(p.version),
            _ => None,
        })
        .collect();
    assert_eq!(versions, [1, 2], "a version per group, each published once");
    // Plan order: count-lines is group 0 (version 0), hello-file group 1.
    let group_of_session: BTreeMap<String, String> = read(Topic::Rollouts)
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(r) => Some((r.session_id.clone(), r.task_id.clone())),
            _ => None,
        })
        .collect();
    let mut served: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for e in read(Topic::Calls) {
        // A call past the budget of two is answered by the proxy, not the engine.
        if let Event::CallFinished(c) = e.clone() {
            if c.status != CallStatus::Ok {
                assert_eq!(c.status, CallStatus::BudgetStop, "{e:?}");
                continue;
            }
            served
                .entry(group_of_session[&c.session_id].clone())
                .or_default()
                .insert(c.policy_version.expect("the engine reports its version"));
        }
    }
    assert_eq!(
        served,
        BTreeMap::from([
            ("count-lines".to_string(), BTreeSet::from([0])),
            ("hello-file".to_string(), BTreeSet::from([1])),
        ]),
        "each group sampled by the version before it"
    );
    // Token in through the embedded engine: every follow-up call (a
    // rollout's second) holds the ids the model sampled before it.
    let mut recorded = read(Topic::Rollouts);
    recorded.extend(read(Topic::Calls));
    let rate = forgelog_consumers::core::clean::clean_rates(&recorded)["mini-swe-agent"];
    eprintln!("CLEAN mini-swe-agent through the embedded engine: {rate:?}");
    assert!(rate.follow_ups >= 4, "a follow-up per rollout: {rate:?}");
    assert_eq!(rate.clean, rate.follow_ups, "{rate:?}");

    // The trained version as a Hugging Face folder: the same model to
    // transformers as to forgelog, and not the one the run started from.
    let exported = tempfile::tempdir().unwrap();
    let export = |version: &str| {
        Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(["export", "model", "--run", &run, "--version", version])
            .arg("--to")
            .arg(exported.path())
            .args(["--brokers", &stream.brokers])
            .output()
            .unwrap()
    };
    let missing = export("7");
    assert_eq!(missing.status.code(), Some(2), "{}", stderr_of(&missing));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no version 7; it has 1, 2"));
    let out = export("2");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let device = candle_core::Device::Cpu;
    let trained = forgelog_model::load_hf_dir(exported.path(), &device).unwrap();
    let checked = support::check_hf_model_folder(exported.path(), &trained);
    eprintln!("exported version 2: {checked}");
    let v2 = read(Topic::Policy)
        .into_iter()
        .find_map(|e| match e {
            Event::PolicyPublished(p) if p.version == 2 => Some(p.checkpoint_uri),
            _ => None,
        })
        .unwrap();
    let v2 = v2.strip_prefix("file://").unwrap();
    assert!(
        std::fs::read(v2).unwrap()
            == std::fs::read(exported.path().join("model.safetensors")).unwrap(),
        "the folder holds version 2's weights"
    );
}

/// A verifier that crashes or writes NaN inside a training run: its rollouts'
/// rewards are null (never a 0 the learner would train on), their groups
/// teach nothing, and admission goes on: every group after them is sampled,
/// on policy, by a published version.
#[test]
fn a_verifier_that_crashes_or_writes_nan_never_becomes_a_reward_nor_stalls_training() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let run = unique_run_id("run-train-faults");
    let run_dirs = support::RunDirs::default();
    run_dirs.add(&run);
    let tasks = tempfile::tempdir().unwrap();
    let t = tasks.path();
    variant(t, "a-verifier-crashes", "tests/test.sh", "exit 3\n");
    variant(
        t,
        "b-reward-nan",
        "tests/test.sh",
        "echo NaN > /logs/verifier/reward.txt\n",
    );
    variant(t, "c-hello", "instruction.md", "Write hello.txt.\n");
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama_with_context(model.path(), 13, 8192).unwrap();
    let mut train = train_command_in(t, &run, model.path(), &stream, &[]);
    let out = output_timed(
        train.args(["--learning-rate", "1e-3"]),
        "forgelog run --train (faulty verifiers)",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));

    let read = |topic: Topic| events_of(&stream, topic, &run);
    let verdicts: Vec<VerifierResult> = read(Topic::Rewards)
        .into_iter()
        .filter_map(|e| match e {
            Event::VerifierResult(v) => Some(v),
            _ => None,
        })
        .collect();
    for faulty in ["a-verifier-crashes", "b-reward-nan"] {
        let theirs: Vec<&VerifierResult> = verdicts
            .iter()
            .filter(|v| v.rollout_id.contains(faulty))
            .collect();
        assert!(theirs.len() >= 2, "{faulty}: {verdicts:?}");
        for v in theirs {
            assert_eq!(
                (v.ok, v.reward),
                (false, None),
                "{faulty}: never a 0: {v:?}"
            );
        }
    }
    // Three groups, a version published after each: the faulty groups held
    // nothing up, and the last group was sampled by the version before it.
    let versions: Vec<i64> = published(&stream, &run).iter().map(|p| p.version).collect();
    assert_eq!(
        versions,
        [1, 2, 3],
        "a version per group, each published once"
    );
    let hello_sessions: BTreeSet<String> = read(Topic::Rollouts)
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(r) if r.task_id == "c-hello" => Some(r.session_id.clone()),
            _ => None,
        })
        .collect();
    let served: BTreeSet<i64> = read(Topic::Calls)
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c)
                if c.status == CallStatus::Ok && hello_sessions.contains(&c.session_id) =>
            {
                c.policy_version
            }
            _ => None,
        })
        .collect();
    assert_eq!(served, BTreeSet::from([2]), "the last group, on policy");
}

/// A learner step goes where the rewards say, through forgelog's engine and
/// a real harness, token in: SmolLM2 samples a group of six mini-swe-agent
/// rollouts of hello-file (two calls each, spliced into one trajectory with
/// the tool's output between them at mask 0; the grammar of
/// [`HELLO_FILE_COMMANDS`] gives them different rewards), the learner takes
/// one step, and forgelog's model code teacher-forces the group's
/// trajectories with the weights that sampled them and with the version the
/// step published: the sampled decisions (logprob below
/// [`DECISION`](crate::support::gradient::DECISION) when sampled) rose in the
/// rollouts with a positive advantage and fell in those with a negative one.
/// (Through vLLM, the same: tests/vllm/main.rs.)
#[test]
fn a_learner_step_moves_smollm2_where_the_rewards_say_through_forgelogs_engine() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let run_dirs = support::RunDirs::default();
    // Six rollouts, not eight: the step and the two teacher-forced passes
    // cost about 25 s of CPU a trajectory. A group that scored alike (about
    // 1 in 30) teaches nothing: a new run.
    let (run, batch) = a_group_with_variance(&stream, "hello-file", |_| {
        let run = unique_run_id("run-gradient");
        run_dirs.add(&run);
        let mut train = Command::new(env!("CARGO_BIN_EXE_forgelog"));
        train
            .arg("run")
            .arg(shipped())
            .args(["--harness", "mini-swe-agent", "--run", &run])
            .args(["--task", "hello-file", "--group-size", "6"])
            .args(["--concurrency", "3"])
            .args(["--max-model-calls", "2", "--max-tokens", "96"])
            .args([
                "--extra-body",
                &tool_call_grammar("bash", "command", HELLO_FILE_COMMANDS),
            ])
            .args(["--brokers", &stream.brokers])
            .args(["--train", "--groups-per-step", "1", "--max-staleness", "0"])
            .args(["--learning-rate", CHECK_LEARNING_RATE]);
        let out = output_timed(&mut train, "forgelog run --train (SmolLM2)");
        assert!(out.status.success(), "{}", stderr_of(&out));
        run
    });
    assert_learner_reads_the_choices(&batch, 6);
    assert!(
        batch.members.iter().flat_map(|m| &m.sequences).all(|s| s
            .loss_mask
            .windows(2)
            .filter(|w| w == &[0, 1])
            .count()
            >= 2),
        "each trajectory holds both calls' answers"
    );

    let published = published(&stream, &run);
    assert_eq!(published.len(), 1, "one step, one version");
    let v1 = Path::new(published[0].checkpoint_uri.strip_prefix("file://").unwrap());
    let device = candle_core::Device::Cpu;
    let forced_by = |policy: &forgelog_model::Policy| -> Vec<Vec<f64>> {
        trajectories(&batch)
            .map(|ids| teacher_forced_by(policy, ids))
            .collect()
    };
    let models = forgelog_stream::models_dir();
    let before = forced_by(&forgelog_model::load_policy("smollm2", &models, &device).unwrap());
    let after = forced_by(&forgelog_model::load_hf_dir(v1.parent().unwrap(), &device).unwrap());
    let moves = LogprobMoves::of(&batch, &before, &after);
    eprintln!(
        "GRADIENT DIRECTION through forgelog's engine, one step on hello-file's group: {moves}"
    );
    assert!(moves.positive.mean() > 0.0, "{moves}");
    assert!(moves.negative.mean() < 0.0, "{moves}");
}

/// A learner that cannot start (its checkpoint directory is a file) ends
/// `forgelog run --train` with its reason, instead of rollouts waiting
/// forever for a version nobody will publish; one that fails at the last
/// step fails the run too.
#[test]
fn a_training_run_whose_learner_fails_fails_and_says_why() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stream = rt.block_on(shared_broker());
    let run = unique_run_id("run-nolearner");
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama_with_context(model.path(), 13, 8192).unwrap();
    std::fs::create_dir_all(run_dir(&run).join("checkpoints")).unwrap();
    std::fs::write(run_dir(&run).join("checkpoints").join(&run), "in the way").unwrap();
    let started = Instant::now();
    let out = train_command(&run, model.path(), &stream, &["count-lines", "hello-file"])
        .output()
        .unwrap();
    // All of it: with RUST_BACKTRACE set, a backtrace follows the message.
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!(
        "forgelog run --train, no learner: {} in {:.1} s\n{stderr}",
        out.status,
        started.elapsed().as_secs_f64(),
    );
    assert!(!out.status.success());
    assert!(stderr.contains("the learner failed"), "{stderr}");
    assert_eq!(slots_of(&run), 0, "the sandboxes are gone");
    let _ = std::fs::remove_dir_all(run_dir(&run));

    // A learner that fails at the run's last step (its version cannot be
    // written, as on a full disk, where this was found: the run said
    // nothing and exited 0) fails the run too, once its rollouts are done.
    let run = unique_run_id("run-nopublish");
    let versions = run_dir(&run).join("checkpoints").join(&run);
    std::fs::create_dir_all(&versions).unwrap();
    std::fs::write(versions.join("v000001"), "in the way").unwrap();
    let out = train_command(&run, model.path(), &stream, &["hello-file"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!(
        "forgelog run --train, no version written: {}\n{stderr}",
        out.status
    );
    assert!(!out.status.success());
    assert!(
        stderr.contains("the learner failed") && stderr.contains("0 of 1 versions published"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("mini-swe-agent"),
        "the rollouts' outcomes are printed"
    );
    let _ = std::fs::remove_dir_all(run_dir(&run));
}
