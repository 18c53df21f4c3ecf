use super::*;
use clap::Parser;
use forgelog_schemas::{Event, PolicyPublished, Topic};

/// How the `forgelog` CLI embeds the arguments.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Train(TrainArgs),
}

#[test]
fn arguments_parse_as_a_subcommand() {
    let Command::Train(args) = Cli::parse_from(["forgelog", "train"]).command;
    assert_eq!(
        (args.model.as_str(), args.device, args.max_staleness),
        ("smollm2", DeviceKind::Cpu, 4)
    );
    assert_eq!(args.learner_config().loss, LossConfig::default());
    let Command::Train(args) = Cli::parse_from([
        "forgelog",
        "train",
        "--model",
        "/models/qwen",
        "--device",
        "cuda",
        "--checkpoints",
        "s3://bucket/ckpt",
        "--max-staleness",
        "2",
        "--run",
        "r1",
        "--normalisation",
        "per-sequence",
        "--kl",
        "0.01",
    ])
    .command;
    assert_eq!(args.device, DeviceKind::Cuda);
    assert_eq!(args.checkpoints.as_deref(), Some("s3://bucket/ckpt"));
    assert_eq!((args.max_staleness, args.run.as_str()), (2, "r1"));
    let config = args.learner_config();
    assert_eq!(config.loss.normalisation, Normalisation::PerSequence);
    assert_eq!(config.loss.kl_coefficient, Some(0.01));
}

/// The fast tier: the trainer shell on a memory log, the tiny llama, no broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_memory_log_a_restarted_trainer_resumes_and_trains_only_new_batches() {
    use forgelog_schemas::testing::training_batch;
    use forgelog_stream::MemoryLog;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    forgelog_model::testing::write_tiny_llama(&model, 3).unwrap();
    let checkpoints = format!("file://{}/checkpoints", dir.path().display());
    let Command::Train(args) = Cli::parse_from([
        "forgelog",
        "train",
        "--model",
        model.to_str().unwrap(),
        "--run",
        "mem",
        "--checkpoints",
        &checkpoints,
        "--tokens-per-step",
        "1",
        "--max-steps",
        "1",
        "--learning-rate",
        "1e-3",
        "--idle-flush",
        "0.1",
        "--keep-versions",
        "2",
    ])
    .command;
    let log = MemoryLog::default();
    let published = |log: &MemoryLog| -> Vec<PolicyPublished> {
        log.events(Topic::Policy.name())
            .into_iter()
            .filter_map(|e| match e {
                Event::PolicyPublished(p) => Some(p),
                _ => None,
            })
            .collect()
    };
    log.append(&training_batch("other-run", "x", 5, 0)).unwrap();
    log.append(&training_batch("mem", "a", 2, 0)).unwrap();
    train(&args, &log, &log).await.unwrap();
    let first = published(&log);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].version, first[0].step), (1, 1));
    assert_eq!(
        first[0].metrics["tokens"], 4.0,
        "group a: 2 members x 2 sampled tokens"
    );

    log.append(&training_batch("mem", "b", 3, 1)).unwrap();
    train(&args, &log, &log).await.unwrap();
    let both = published(&log);
    assert_eq!(both.len(), 2);
    assert_eq!((both[1].version, both[1].step), (2, 2));
    assert_eq!(both[1].metrics["tokens"], 6.0, "group b only");
    assert!(both[1]
        .checkpoint_uri
        .ends_with("/v000002/model.safetensors"));

    // A third version: the first goes (two are kept), and only the newest
    // has optimizer moments; a restart still resumes from it.
    let version_files = |v: u32| -> Vec<String> {
        let folder = dir.path().join(format!("checkpoints/mem/v{v:06}"));
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    assert!(version_files(1).contains(&"model.safetensors".to_string()));
    log.append(&training_batch("mem", "c", 2, 2)).unwrap();
    train(&args, &log, &log).await.unwrap();
    assert_eq!(published(&log).len(), 3);
    assert!(
        !dir.path().join("checkpoints/mem/v000001").exists(),
        "version 1 is gone, its folder too"
    );
    let kept = version_files(2);
    assert!(
        kept.contains(&"model.safetensors".to_string())
            && kept.contains(&"config.json".to_string())
    );
    assert!(
        !kept.contains(&"optimizer.safetensors".to_string()),
        "{kept:?}"
    );
    assert!(version_files(3).contains(&"optimizer.safetensors".to_string()));
    log.append(&training_batch("mem", "d", 2, 3)).unwrap();
    train(&args, &log, &log).await.unwrap();
    let all = published(&log);
    assert_eq!((all.len(), all[3].version, all[3].step), (4, 4, 4));
}
