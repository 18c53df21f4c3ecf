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

/// `forgelog train`'s flags as clap parses them.
fn parsed(flags: &[&str]) -> Result<crate::TrainArgs, String> {
    use clap::{Args, FromArgMatches};
    let command = crate::TrainArgs::augment_args(clap::Command::new("train"));
    let args = std::iter::once("train").chain(flags.iter().copied());
    let matches = command
        .try_get_matches_from(args)
        .map_err(|e| e.to_string())?;
    crate::TrainArgs::from_arg_matches(&matches).map_err(|e| e.to_string())
}

/// Found by probing `forgelog train`: `--learning-rate nan` trained,
/// `--tokens-per-step 0` published an empty version every second,
/// `--idle-flush nan` and `--publish-every 0` panicked, `--temperature 0`
/// divided the logits by 0.
#[test]
fn values_the_learner_cannot_train_with_are_refused_naming_the_flag() {
    let refused = [
        ("--learning-rate", "nan", "must be a finite number"),
        ("--learning-rate", "-1e-6", "must be above 0"),
        ("--learning-rate", "0", "must be above 0"),
        ("--temperature", "0", "must be above 0"),
        ("--is-cap", "inf", "must be a finite number"),
        ("--max-grad-norm", "0", "must be above 0"),
        ("--weight-decay", "-0.1", "must be 0 or more"),
        ("--kl", "nan", "must be a finite number"),
        ("--lora-alpha", "0", "must be above 0"),
        ("--idle-flush", "nan", "must be a finite number"),
        ("--idle-flush", "-1", "must be 0 or more"),
        ("--tokens-per-step", "0", "must be 1 or more"),
        ("--micro-batch-tokens", "0", "must be 1 or more"),
        ("--groups-per-step", "0", "must be 1 or more"),
        ("--lora-rank", "0", "must be 1 or more"),
        ("--publish-every", "0", "0 is not in 1.."),
        ("--keep-versions", "0", "0 is not in 1.."),
    ];
    for (flag, value, why) in refused {
        let err = parsed(&[&format!("{flag}={value}")]).unwrap_err();
        assert!(
            err.contains(&format!("invalid value '{value}' for '{flag} <")) && err.contains(why),
            "{flag} {value}: {err}"
        );
    }
    let args = parsed(&["--weight-decay", "0", "--kl", "0", "--idle-flush", "0"]).unwrap();
    assert_eq!(
        (args.weight_decay, args.kl, args.idle_flush),
        (0.0, Some(0.0), 0.0)
    );
}
