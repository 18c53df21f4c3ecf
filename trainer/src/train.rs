//! The learner's loop over the log: resumed where the run's last published
//! version left it, then steps from `forgelog.batches` and a version
//! published every `--publish-every` steps.

use crate::checkpoint::{CheckpointStore, TrainerState};
use crate::{device_and_dtype, learner, Learner, LoraConfig, LoraPublish, StepMetrics};
use crate::{TrainArgs, TrainError};
use candle_core::DType;
use forgelog_schemas::{event_id, Event, PolicyPublished, Topic};
use forgelog_stream::{EventSink, LogReader};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

/// Resumes from the run's last published checkpoint (or starts from
/// `--model` as version 0), then trains on `forgelog.batches` from the
/// positions that checkpoint reflects, publishing every `--publish-every`
/// steps, until stopped (or `--max-steps`). Reads `log` (blocking reads, so a
/// multi-threaded runtime), writes `PolicyPublished` into `sink`: the Kafka
/// log in production, a memory log in the fast tests.
pub async fn train(
    args: &TrainArgs,
    log: &impl LogReader,
    sink: &impl EventSink,
) -> Result<(), TrainError> {
    let lora = args.lora()?;
    let (mut learner, state, store) = resume(args, log, sink).await?;
    // The first offsets of forgelog.batches this learner has not trained on:
    // they travel in the checkpoint, so a restart continues exactly there.
    let mut positions = state.offsets.clone();
    let mut assembler = learner::StepAssembler::new(args.tokens_per_step);
    assembler.groups_per_step = args.groups_per_step;
    assembler.dropped_stale = state.dropped_stale;
    let idle = Duration::from_secs_f64(args.idle_flush);
    let mut last_new = std::time::Instant::now();
    let mut steps_here = 0u64;
    loop {
        if args.max_steps.is_some_and(|m| steps_here >= m) {
            break;
        }
        let swept = tokio::task::block_in_place(|| {
            sweep(args, log, &learner, &mut positions, &mut assembler)
        });
        let new = match swept {
            // The broker away (restarting, say): what was read stands, in
            // `positions` and the assembler; the next sweep goes on from there.
            Err(TrainError::Consume(e)) => {
                tracing::warn!(error = %e, "trainer: the log is unreachable; reading again shortly");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            other => other?,
        };
        if new > 0 {
            last_new = std::time::Instant::now();
        }
        let ready = assembler.full() || (!assembler.is_empty() && last_new.elapsed() >= idle);
        if !ready {
            if new == 0 {
                tokio::time::sleep(idle.min(Duration::from_millis(200))).await;
            }
            continue;
        }
        let batches = assembler.take();
        let started = std::time::Instant::now();
        let (moved, metrics) = tokio::task::spawn_blocking(move || {
            let metrics = learner.train_step(&batches);
            (learner, metrics)
        })
        .await
        .map_err(|e| TrainError::Invalid(e.to_string()))?;
        learner = moved;
        let metrics = metrics?;
        steps_here += 1;
        ::metrics::counter!("forgelog_trainer_steps_total").increment(1);
        ::metrics::histogram!("forgelog_trainer_step_seconds")
            .record(started.elapsed().as_secs_f64());
        ::metrics::gauge!("forgelog_trainer_loss").set(metrics.loss);
        ::metrics::counter!("forgelog_trainer_tokens_total").increment(metrics.tokens as u64);
        tracing::info!(
            step = learner.step,
            loss = metrics.loss,
            tokens = metrics.tokens,
            "step"
        );
        if learner.step % args.publish_every == 0 {
            let state = TrainerState {
                offsets: positions.clone(),
                dropped_stale: assembler.dropped_stale,
                ..learner.next_version()
            };
            let published = Published {
                args,
                store: &store,
                lora: lora.as_ref(),
            };
            published.publish(&learner, &state, &metrics, sink).await?;
        }
    }
    Ok(())
}

/// The learner where the run's last published checkpoint left it (or
/// `--model` as version 0), with that checkpoint's state and the store
/// the next versions go to.
async fn resume(
    args: &TrainArgs,
    log: &impl LogReader,
    sink: &impl EventSink,
) -> Result<(Learner, TrainerState, CheckpointStore), TrainError> {
    let (device, dtype) = device_and_dtype(args)?;
    let lora = args.lora()?;
    let base = match &args.checkpoints {
        Some(url) => url.clone(),
        None => format!(
            "file://{}/.forgelog/checkpoints",
            std::env::current_dir()
                .map_err(|e| TrainError::Invalid(e.to_string()))?
                .display()
        ),
    };
    // A location that cannot be written fails before the model loads.
    let store = CheckpointStore::new(&base, &args.run)?;
    let spec = args.model.clone();
    let load_device = device.clone();
    let policy = tokio::task::spawn_blocking(move || {
        forgelog_model::load_policy(&spec, &forgelog_stream::models_dir(), &load_device)
    })
    .await
    .map_err(|e| TrainError::Invalid(e.to_string()))??;
    let model_config = policy.model.config().clone();
    let torch_dtype = match dtype {
        DType::BF16 => "bfloat16",
        _ => "float32",
    };
    let store = store.with_folder_files(forgelog_model::hf::folder_files(&policy, torch_dtype)?);

    // A `PolicyPublished` a killed trainer left in its spool is delivered
    // first: read before it arrives, the last version would be the one
    // before, and that step would be trained and published a second time.
    sink.flush(Duration::from_secs(600)).await?;
    let resume = loop {
        match tokio::task::block_in_place(|| forgelog_stream::newest_policy(log, Some(&args.run))) {
            // Gone since the topics were made (unreachable, or a read cut
            // off: `BrokerTransportFailure` as a message error ended a
            // restarted trainer in the chaos test): waited for, as in
            // `train`'s sweeps, which take every read error as the log away.
            Err(e) => {
                tracing::warn!(error = %e, "trainer: waiting for the broker to resume");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(newest) => break newest,
        }
    };
    let (weights, moments, state) = match &resume {
        Some(p) if lora.is_some() => {
            // The frozen weights are the initial policy's; the adapter is the version's.
            let (moments, state) = store.load_state(p.version as u64, &device).await?;
            let mut weights = policy.weights;
            weights.extend(store.load_adapter(p.version as u64, &device).await?);
            tracing::info!(
                version = p.version,
                step = state.step,
                "resuming LoRA from the last published policy"
            );
            (weights, moments, state)
        }
        Some(p) => {
            let (weights, moments, state) = store.load(p.version as u64, &device).await?;
            tracing::info!(
                version = p.version,
                step = state.step,
                "resuming from the last published policy"
            );
            (weights, moments, state)
        }
        None => (policy.weights, Default::default(), TrainerState::default()),
    };
    drop(policy.model);
    let mut learner = Learner::new(
        &weights,
        &model_config,
        &device,
        dtype,
        args.learner_config(),
    )?;
    drop(weights);
    learner.version = state.version;
    learner.step = state.step;
    learner.optimizer.steps = state.optimizer_steps;
    learner.optimizer.moments = moments;
    Ok((learner, state, store))
}

/// What is new in each partition of `forgelog.batches` since `positions`,
/// offered to `assembler` until it holds a step's worth; how many records
/// were read.
fn sweep(
    args: &TrainArgs,
    log: &impl LogReader,
    learner: &Learner,
    positions: &mut BTreeMap<i32, i64>,
    assembler: &mut learner::StepAssembler,
) -> Result<usize, TrainError> {
    let topic = Topic::Batches.name();
    let mut new = 0usize;
    for partition in log.partitions(topic)? {
        let from = positions.get(&partition).copied().unwrap_or(0);
        let end = log.end(topic, partition)?;
        let flow = log.for_each_in(topic, partition, from, end, |rec| {
            positions.insert(partition, rec.offset + 1);
            new += 1;
            match rec.event {
                Ok(Event::TrainingBatch(batch)) if batch.run_id == args.run => {
                    assembler.offer(learner, batch);
                }
                Ok(_) => {}
                Err(why) => {
                    tracing::warn!(offset = rec.offset, %why, "not a forgelog event on forgelog.batches")
                }
            }
            if assembler.full() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if flow.is_break() {
            break;
        }
    }
    Ok(new)
}

/// Where a version goes and what it holds.
struct Published<'a> {
    args: &'a TrainArgs,
    store: &'a CheckpointStore,
    lora: Option<&'a LoraConfig>,
}

impl Published<'_> {
    /// Saves the learner's version with `state` (the adapter alone, the
    /// merged weights, or both), says so on the log, then prunes old versions.
    async fn publish(
        &self,
        learner: &Learner,
        state: &TrainerState,
        metrics: &StepMetrics,
        sink: &impl EventSink,
    ) -> Result<(), TrainError> {
        let args = self.args;
        let adapter = match self.lora {
            Some(lora) => {
                forgelog_model::lora::adapter_files(&learner.weights(), lora, &args.model)?
            }
            None => Vec::new(),
        };
        // An adapter alone is published without the merged weights.
        let merged = match self.lora.is_some() && args.lora_publish == LoraPublish::Adapter {
            true => None,
            false => Some(learner.model_weights()?),
        };
        let uri = self
            .store
            .save(merged.as_ref(), &learner.optimizer.moments, state, &adapter)
            .await?;
        let mut values = metrics.to_map();
        values.insert("dropped_stale".into(), state.dropped_stale as f64);
        let version = learner.version.to_string();
        sink.send(&Event::PolicyPublished(PolicyPublished {
            event_id: event_id("PolicyPublished", &[&args.run, &version]),
            run_id: args.run.clone(),
            version: learner.version as i64,
            step: learner.step as i64,
            checkpoint_uri: uri,
            metrics: values,
        }))?;
        sink.flush(Duration::from_secs(600)).await?;
        ::metrics::gauge!("forgelog_trainer_policy_version").set(learner.version as f64);
        // Only once the version is published: until then a restart
        // resumes from the one before, with its moments.
        self.store
            .prune(learner.version, args.keep_versions)
            .await?;
        Ok(())
    }
}
