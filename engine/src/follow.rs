//! Following the policy topic: each newer `PolicyPublished` is loaded.

use crate::{Engine, EngineError, DEFAULT_MAX_CHECKPOINT_BYTES};

/// Follows `forgelog.policy` and loads each `PolicyPublished` newer than what
/// serves (of `run`, when given). Every engine reads every policy, so the
/// consumer group is this process's own; it starts from the beginning of the
/// topic and so ends on the newest policy. A (re)started engine first loads
/// the newest one the topic holds, so that it does not load every version
/// of a long run on its way there.
pub async fn follow_policy(
    engine: Engine,
    brokers: &str,
    run: Option<&str>,
) -> Result<(), EngineError> {
    use forgelog_schemas::{Event, Topic};
    let config = forgelog_stream::StreamConfig::new(brokers);
    let group = format!(
        "forgelog-engine-{}-{}",
        std::process::id(),
        engine.model_name()
    );
    let newest = {
        let config = config.clone();
        let run = run.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            let reader = forgelog_stream::ReplayReader::new(&config)?;
            forgelog_stream::newest_policy(&reader, run.as_deref())
        })
        .await
    };
    match newest {
        Ok(Ok(Some(p))) => load_published(&engine, &p).await,
        Ok(Ok(None)) => {}
        // Not fatal: following the topic from its beginning gets there too.
        Ok(Err(e)) => tracing::warn!(error = %e, "reading the newest policy"),
        Err(e) => tracing::warn!(error = %e, "reading the newest policy"),
    }
    let consumer = forgelog_stream::EventConsumer::new(&config, &group, &[Topic::Policy])?;
    loop {
        let received = consumer.recv().await?;
        let published = match received.event {
            Ok(Event::PolicyPublished(p)) if run.is_none_or(|r| r == p.run_id) => p,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(
                    offset = received.offset,
                    "undecodable message on forgelog.policy: {e}"
                );
                continue;
            }
        };
        load_published(&engine, &published).await;
    }
}

/// Loads `published` if it is newer than what the engine serves.
async fn load_published(engine: &Engine, published: &forgelog_schemas::PolicyPublished) {
    let version = published.version.max(0) as u64;
    if version <= engine.policy_version() {
        return;
    }
    let reloaded = engine
        .reload(
            &published.checkpoint_uri,
            version,
            DEFAULT_MAX_CHECKPOINT_BYTES,
        )
        .await;
    if let Err(e) = reloaded {
        tracing::error!(version, uri = %published.checkpoint_uri, "policy not loaded: {e}");
    }
}
