//! Following `forgelog.policy`: the engine made to serve each version as it
//! is published, from the newest one on.

use crate::{EngineSync, SyncArgs, SyncError};
use forgelog_schemas::{Event, PolicyPublished, Topic};
use forgelog_sync_core as core;

/// Follows `forgelog.policy` at `brokers` and makes the engine serve each
/// version newer than what it serves ([`EngineSync::start`]: a restarted
/// sync goes on from the log and the engine's own word). Returns the first
/// failed sync's error: whoever watches it stops sampling.
pub async fn follow(sync: &EngineSync, brokers: &str) -> Result<(), SyncError> {
    let served = sync.start().await?;
    follow_from(sync, brokers, served).await
}

/// [`follow`], the engine serving `served` already (from [`EngineSync::start`]).
pub async fn follow_from(
    sync: &EngineSync,
    brokers: &str,
    mut served: Option<u64>,
) -> Result<(), SyncError> {
    let config = forgelog_stream::StreamConfig::new(brokers);
    let run = sync.args.run.clone();
    let newest = {
        let (config, run) = (config.clone(), run.clone());
        tokio::task::spawn_blocking(move || {
            let reader = forgelog_stream::ReplayReader::new(&config)?;
            forgelog_stream::newest_policy(&reader, run.as_deref())
        })
        .await
        .expect("the newest policy's reader does not panic")?
    };
    let nothing_served = served.is_none();
    let mut serve = async |p: &PolicyPublished| -> Result<(), SyncError> {
        let version = p.version.max(0) as u64;
        if served.is_some_and(|s| s >= version) {
            return Ok(());
        }
        let took = sync.serve(p).await?;
        tracing::info!(version, secs = took.as_secs_f64(), engine = %sync.engine(), "serving");
        served = Some(version);
        Ok(())
    };
    match newest {
        Some(p) => serve(&p).await?,
        // Paused with nothing to load: it stays so, and says why.
        None if nothing_served => {
            if let Some(query) = core::paused_query(sync.args.engine) {
                if core::is_paused(&sync.send(&query).await?) {
                    return Err(SyncError::PausedWithNothingToLoad {
                        engine: sync.engine(),
                    });
                }
            }
        }
        None => {}
    }
    let group = format!("forgelog-sync-{}", std::process::id());
    let consumer = forgelog_stream::EventConsumer::new(&config, &group, &[Topic::Policy])?;
    loop {
        let received = consumer.recv().await?;
        match received.event {
            Ok(Event::PolicyPublished(p)) if run.as_ref().is_none_or(|r| *r == p.run_id) => {
                serve(&p).await?
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                offset = received.offset,
                "undecodable message on forgelog.policy: {e}"
            ),
        }
    }
}

/// `forgelog sync`: [`follow`] until `shutdown` completes or a sync fails.
pub async fn run(
    args: SyncArgs,
    brokers: &str,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), SyncError> {
    let sync = EngineSync::new(args);
    tokio::select! {
        followed = follow(&sync, brokers) => followed,
        () = shutdown => Ok(()),
    }
}
