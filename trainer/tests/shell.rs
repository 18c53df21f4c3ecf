//! `forgelog train` against the broker (`FORGELOG_BROKERS`, else 127.0.0.1:9092)
//! on the tiny llama: a step publishes a checkpoint and `PolicyPublished`; a
//! restarted trainer resumes from it and trains only on what came after.

use clap::Parser;
use forgelog_schemas::testing::training_batch;
use forgelog_schemas::{Event, PolicyPublished, Topic};
use forgelog_stream::testing::{produce, shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, StartAt};
use forgelog_trainer::TrainArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    train: TrainArgs,
}

fn published(config: &forgelog_stream::StreamConfig, run: &str) -> Vec<PolicyPublished> {
    let reader = ReplayReader::new(config).unwrap();
    reader
        .read(Topic::Policy.name(), StartAt::Beginning, Some(run))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.event {
            Ok(Event::PolicyPublished(p)) => Some(p),
            _ => None,
        })
        .collect()
}

/// `forgelog train` for one step of the tiny llama in `dir/model`, its
/// checkpoints and spool (`dir/spool`) under `dir`.
fn one_step(
    config: &forgelog_stream::StreamConfig,
    run: &str,
    dir: &std::path::Path,
    spool: &str,
) -> TrainArgs {
    Cli::parse_from([
        "train",
        "--model",
        dir.join("model").to_str().unwrap(),
        "--brokers",
        &config.brokers,
        "--run",
        run,
        "--checkpoints",
        &format!("file://{}/checkpoints", dir.display()),
        "--spool",
        dir.join(spool).to_str().unwrap(),
        "--tokens-per-step",
        "1",
        "--max-steps",
        "1",
        "--learning-rate",
        "1e-3",
    ])
    .train
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_trainer_resumes_from_its_last_policy_and_trains_only_new_batches() {
    let config = shared_broker().await;
    let run = unique_run_id("trainer-shell");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    forgelog_model::testing::write_tiny_llama(&model, 3).unwrap();
    let args = |spool: &str| one_step(&config, &run, dir.path(), spool);

    produce(&config, &[training_batch(&run, "a", 2, 0)]).await;
    forgelog_trainer::run(args("spool-1")).await.unwrap();
    let policies = published(&config, &run);
    assert_eq!(policies.len(), 1);
    let first = &policies[0];
    assert_eq!((first.version, first.step), (1, 1));
    assert_eq!(
        first.metrics["tokens"], 4.0,
        "group a: 2 members x 2 sampled tokens"
    );
    let path = first.checkpoint_uri.strip_prefix("file://").unwrap();
    assert!(std::path::Path::new(path).is_file(), "{path}");

    // A new process: resumes at version 1 and trains on group b only.
    produce(&config, &[training_batch(&run, "b", 3, 1)]).await;
    forgelog_trainer::run(args("spool-2")).await.unwrap();
    let policies = published(&config, &run);
    assert_eq!(policies.len(), 2);
    let second = &policies[1];
    assert_eq!((second.version, second.step), (2, 2));
    assert_eq!(
        second.metrics["tokens"], 6.0,
        "group b only: 2 members x 3 sampled tokens"
    );
    assert_eq!(second.metrics["staleness_max"], 0.0);
    assert!(second
        .checkpoint_uri
        .ends_with("/v000002/model.safetensors"));
}

/// A trainer killed after its `PolicyPublished` reached its spool but before
/// the broker had it: the next process delivers it first and resumes from that
/// version. (Reading the log first, it resumed from the version before and
/// trained and published that step a second time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_left_in_the_spool_by_a_killed_trainer_is_published_once() {
    let config = shared_broker().await;
    let run = unique_run_id("trainer-spool");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    forgelog_model::testing::write_tiny_llama(&model, 3).unwrap();
    let spool = dir.path().join("spool");
    let args = one_step(&config, &run, dir.path(), "spool");
    produce(&config, &[training_batch(&run, "a", 2, 0)]).await;

    // The first process reads the log, but what it publishes never leaves its
    // spool (its producer's broker is unreachable); it dies once it is there.
    let (first, spool_dir, reads) = (args.clone(), spool.clone(), config.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let reader = ReplayReader::new(&reads).unwrap();
            let unreachable = forgelog_stream::StreamConfig::new("127.0.0.1:1");
            let sink =
                forgelog_stream::EventProducer::start(&unreachable, &spool_dir, Default::default())
                    .unwrap();
            let training =
                tokio::spawn(async move { forgelog_trainer::train(&first, &reader, &sink).await });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while forgelog_stream::SpoolStatus::read(&spool_dir).map_or(0, |s| s.pending) == 0 {
                assert!(!training.is_finished(), "{:?}", training.await);
                assert!(
                    std::time::Instant::now() < deadline,
                    "nothing was published"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        rt.shutdown_timeout(std::time::Duration::from_secs(5));
    })
    .join()
    .unwrap();
    assert!(
        published(&config, &run).is_empty(),
        "it never reached the log"
    );

    // The next process, on the same spool: version 1 is delivered, and the
    // step it trains is the next one, on the new group only.
    produce(&config, &[training_batch(&run, "b", 3, 1)]).await;
    forgelog_trainer::run(args).await.unwrap();
    let versions: Vec<(i64, i64)> = published(&config, &run)
        .iter()
        .map(|p| (p.version, p.step))
        .collect();
    assert_eq!(versions, [(1, 1), (2, 2)], "each version published once");
}

/// `forgelog train --lora-rank` on a tiny Qwen3: each version is PEFT's
/// adapter files alone (the published URI names the adapter's weights), a
/// restarted trainer goes on training the version's adapter, not a fresh one,
/// and with `--lora-publish merged` the merged weights (the frozen weights
/// with that adapter merged) are published beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_trainer_publishes_its_adapter_and_resumes_it() {
    use forgelog_model::lora;
    use forgelog_model::testing::{max_abs, max_abs_diff};
    let config = shared_broker().await;
    let run = unique_run_id("trainer-lora");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let model_config = forgelog_model::testing::write_tiny_qwen3(&model, 3).unwrap();
    let args = |spool: &str| {
        let mut args = one_step(&config, &run, dir.path(), spool);
        args.lora_rank = Some(4);
        args
    };
    let device = candle_core::Device::Cpu;
    let version_dir = |v: u64| dir.path().join(format!("checkpoints/{run}/v{v:06}"));
    let max_b = |adapter: &std::collections::HashMap<String, candle_core::Tensor>| {
        adapter
            .iter()
            .filter(|(n, _)| n.ends_with("lora_B.weight"))
            .map(|(_, t)| max_abs(t))
            .fold(0.0f32, f32::max)
    };

    produce(&config, &[training_batch(&run, "a", 2, 0)]).await;
    forgelog_trainer::run(args("spool-1")).await.unwrap();
    let (lora_config, first) = lora::load_adapter_dir(&version_dir(1), &device).unwrap();
    assert_eq!((lora_config.rank, lora_config.alpha), (4, 8.0));
    assert_eq!(lora_config.targets.len(), 7);
    // Adam's first step moves each entry by at most the learning rate.
    assert!(
        max_b(&first) > 0.0 && max_b(&first) <= 1.001e-3,
        "{}",
        max_b(&first)
    );

    produce(&config, &[training_batch(&run, "b", 3, 1)]).await;
    forgelog_trainer::run(args("spool-2")).await.unwrap();
    let policies = published(&config, &run);
    assert_eq!(
        policies.iter().map(|p| p.version).collect::<Vec<_>>(),
        [1, 2]
    );
    let (_, second) = lora::load_adapter_dir(&version_dir(2), &device).unwrap();
    assert!(
        max_b(&second) > 1.2e-3,
        "the second step went on from the first's adapter: {}",
        max_b(&second)
    );
    for (p, v) in policies.iter().zip(1..) {
        assert!(
            p.checkpoint_uri.ends_with("/adapter_model.safetensors"),
            "{}",
            p.checkpoint_uri
        );
        assert!(!version_dir(v).join("model.safetensors").exists());
    }
    // `export model` of an adapter alone: a PEFT folder, no model files.
    let exported = dir.path().join("exported-adapter");
    forgelog_trainer::checkpoint::export_model_folder(&policies[1].checkpoint_uri, &exported)
        .await
        .unwrap();
    let (_, copied) = lora::load_adapter_dir(&exported, &device).unwrap();
    assert_eq!(copied.len(), second.len());
    assert!(!exported.join("model.safetensors").exists());
    assert!(!exported.join("config.json").exists());

    // With --lora-publish merged, the merged weights too.
    produce(&config, &[training_batch(&run, "c", 2, 2)]).await;
    let mut merged_args = args("spool-3");
    merged_args.lora_publish = forgelog_trainer::LoraPublish::Merged;
    forgelog_trainer::run(merged_args).await.unwrap();
    let policies = published(&config, &run);
    assert_eq!(policies.len(), 3);
    assert!(policies[2]
        .checkpoint_uri
        .ends_with("/v000003/model.safetensors"));
    let (_, third) = lora::load_adapter_dir(&version_dir(3), &device).unwrap();
    let base = forgelog_model::load_hf_dir(&model, &device)
        .unwrap()
        .weights;
    let served =
        candle_core::safetensors::load(version_dir(3).join("model.safetensors"), &device).unwrap();
    let merged = lora::merge(&base, &third, &model_config, &lora_config).unwrap();
    for (name, w) in &merged {
        let gap = max_abs_diff(w, &served[name]);
        assert!(gap < 1e-6, "{name}: {gap}");
    }
    let moments =
        candle_core::safetensors::load(version_dir(3).join("optimizer.safetensors"), &device)
            .unwrap();
    assert!(
        moments.keys().all(|n| lora::is_adapter_tensor(&n[2..])),
        "only the adapter has moments"
    );

    // `export model` copies the adapter beside the merged model.
    let exported = dir.path().join("exported");
    forgelog_trainer::checkpoint::export_model_folder(&policies[2].checkpoint_uri, &exported)
        .await
        .unwrap();
    let (_, copied) = lora::load_adapter_dir(&exported, &device).unwrap();
    assert_eq!(copied.len(), third.len());
    assert!(exported.join("model.safetensors").is_file());
}
