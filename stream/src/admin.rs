//! Topic administration. Never deletes topics: on tansu 0.6 DeleteTopics
//! removes every topic.

use crate::StreamConfig;
use forgelog_schemas::Topic;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

/// How the log's topics are laid out.
#[derive(Debug, Clone)]
pub struct TopicLayout {
    pub partitions: i32,
    pub replication: i32,
    /// The topics' `max.message.bytes`, when set: the largest record batch
    /// the broker takes. A broker that does not enforce it (tansu 0.6) still
    /// keeps and describes it, so producers learn the log's ceiling.
    pub max_message_bytes: Option<usize>,
}

impl Default for TopicLayout {
    fn default() -> Self {
        TopicLayout {
            partitions: 3,
            replication: 1,
            max_message_bytes: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Unreachable(#[from] crate::consumer::Unreachable),
    #[error("creating {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
}

impl AdminError {
    fn of(config: &StreamConfig, e: rdkafka::error::KafkaError) -> AdminError {
        crate::consumer::classify(&config.brokers, e)
    }
}

/// Creates every forgelog topic that does not exist yet, with infinite retention
/// (the log is the source of truth). Returns the names it created.
pub async fn create_topics(
    config: &StreamConfig,
    layout: &TopicLayout,
) -> Result<Vec<String>, AdminError> {
    let admin: AdminClient<DefaultClientContext> = config.client("forgelog-admin").create()?;
    // Metadata first: it tells a broker that is down from a slow one (an
    // admin request only times out).
    admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| AdminError::of(config, e))?;
    let max_message_bytes = layout.max_message_bytes.map(|m| m.to_string());
    let new: Vec<NewTopic> = Topic::ALL
        .iter()
        .map(|t| {
            let topic = NewTopic::new(
                t.name(),
                layout.partitions,
                TopicReplication::Fixed(layout.replication),
            )
            .set("retention.ms", "-1")
            .set("retention.bytes", "-1");
            match &max_message_bytes {
                Some(m) => topic.set("max.message.bytes", m),
                None => topic,
            }
        })
        .collect();
    // The request's own limit too: with no broker it would wait for one forever.
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(15)));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(|e| AdminError::of(config, e))?;
    let mut created = Vec::new();
    for result in results {
        match result {
            Ok(name) => created.push(name),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(AdminError::Create { topic, code }),
        }
    }
    Ok(created)
}

/// The largest record batch the broker says `topics` take: the smallest of
/// their `max.message.bytes` (a stock Kafka describes every topic's, its
/// broker default included; tansu 0.6 only those set at creation). `None`
/// when the broker says nothing, or cannot be asked within `timeout`.
pub async fn record_ceiling(
    config: &StreamConfig,
    topics: &[Topic],
    timeout: Duration,
) -> Result<Option<usize>, AdminError> {
    let admin: AdminClient<DefaultClientContext> = config.client("forgelog-admin").create()?;
    let resources: Vec<ResourceSpecifier> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.name()))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let described = admin
        .describe_configs(&resources, &opts)
        .await
        .map_err(|e| AdminError::of(config, e))?;
    Ok(described
        .into_iter()
        .filter_map(Result::ok)
        .flat_map(|resource| resource.entries)
        .filter(|entry| entry.name == "max.message.bytes")
        .filter_map(|entry| entry.value?.trim().parse::<usize>().ok())
        .min())
}

/// `stream` with its claim ceiling ([`crate::claims::ClaimsConfig`])
/// lowered to what the broker says its topics take, less 1/32 for a batch's
/// framing and compression's worst case: an event over it is a claim check,
/// never a record the broker refuses. The producers of events that can be
/// large ask at start: the proxy and the consumer shells. The flag's value
/// holds where the broker says nothing (tansu, unless the topics were
/// created with `max.message.bytes`) or cannot be asked (down at start: the
/// spool waits).
pub async fn within_broker_ceiling(stream: &StreamConfig) -> StreamConfig {
    let mut stream = stream.clone();
    let flag = stream.claims.max_record_bytes;
    match record_ceiling(&stream, &Topic::ALL, Duration::from_secs(3)).await {
        Ok(Some(broker)) => {
            stream.claims.max_record_bytes = flag.min(broker - broker / 32);
            tracing::info!(
                broker_max_message_bytes = broker,
                flag,
                max_record_bytes = stream.claims.max_record_bytes,
                "the broker's topics say the largest record they take"
            );
        }
        Ok(None) => tracing::info!(
            max_record_bytes = flag,
            "the broker does not say its topics' max.message.bytes: --max-record-bytes holds"
        ),
        Err(e) => tracing::warn!(error = %e, max_record_bytes = flag,
            "could not ask the broker its topics' max.message.bytes: --max-record-bytes holds"),
    }
    stream
}

/// A topic as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicInfo {
    pub name: String,
    pub partitions: usize,
    /// Messages in the topic (sum of high minus low watermarks).
    pub messages: i64,
}

/// Every topic on the broker, sorted by name.
pub fn list_topics(config: &StreamConfig) -> Result<Vec<TopicInfo>, AdminError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = config.consumer("forgelog-admin").create()?;
    let timeout = Duration::from_secs(10);
    let md = c
        .fetch_metadata(None, timeout)
        .map_err(|e| AdminError::of(config, e))?;
    let mut out = Vec::new();
    for t in md.topics() {
        let mut messages = 0;
        for p in t.partitions() {
            let (lo, hi) = c
                .fetch_watermarks(t.name(), p.id(), timeout)
                .map_err(|e| AdminError::of(config, e))?;
            messages += hi - lo;
        }
        out.push(TopicInfo {
            name: t.name().to_string(),
            partitions: t.partitions().len(),
            messages,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
