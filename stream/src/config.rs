//! Client settings shared by every Kafka client forgelog makes.

use rdkafka::ClientConfig;

/// Where the log lives. Works unchanged against the local tansu broker,
/// Apache Kafka, Redpanda or a managed service.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Comma-separated `host:port` list.
    pub brokers: String,
    /// Extra librdkafka properties (security, SASL, ...), applied last.
    pub extra: Vec<(String, String)>,
}

/// Largest event the clients accept: a 100k-token call with its raw request fits.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

impl StreamConfig {
    pub fn new(brokers: impl Into<String>) -> StreamConfig {
        StreamConfig {
            brokers: brokers.into(),
            extra: Vec::new(),
        }
    }

    pub(crate) fn client(&self, client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", client_id)
            .set("log_level", "3");
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// Idempotent, `acks=all`, lz4 (tansu 0.6 cannot fetch snappy), Java-compatible
    /// key partitioning, and retries without end: the spool, not librdkafka, decides
    /// when to give up.
    pub(crate) fn producer(&self) -> ClientConfig {
        let mut c = self.client("forgelog-producer");
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", "0")
            .set("linger.ms", "5")
            .set("message.max.bytes", MAX_MESSAGE_BYTES.to_string());
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }

    /// A consumer that never commits on its own.
    pub(crate) fn consumer(&self, group: &str) -> ClientConfig {
        let mut c = self.client("forgelog-consumer");
        c.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.max.bytes", (4 * MAX_MESSAGE_BYTES).to_string())
            .set("max.partition.fetch.bytes", MAX_MESSAGE_BYTES.to_string());
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }
}
