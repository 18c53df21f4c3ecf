//! Client settings shared by every Kafka client forgelog makes.

use rdkafka::ClientConfig;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Where the log lives. Works unchanged against the local tansu broker,
/// Apache Kafka, Redpanda or a managed service.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Comma-separated `host:port` list.
    pub brokers: String,
    /// Extra librdkafka properties (security, SASL, ...), applied last.
    pub extra: Vec<(String, String)>,
    /// Where events too large for one record go ([`crate::claims`]).
    pub claims: crate::claims::ClaimsConfig,
}

/// Largest event the clients accept: a 100k-token call with its raw request fits.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Largest event (key and value) the producer takes into its spool: the
/// message limit less room for the record's framing, so that nothing accepted
/// is then refused by the client.
pub const MAX_EVENT_BYTES: usize = MAX_MESSAGE_BYTES - (64 << 10);

/// Names a file of librdkafka properties that every Kafka client of the process
/// gets: how a cluster's security settings (`security.protocol=SASL_SSL`,
/// `sasl.mechanism`, `ssl.ca.location`, ...) reach the proxy, the engine, the
/// learner and the consumers without a flag on each.
pub const PROPERTIES_ENV: &str = "FORGELOG_KAFKA_CONFIG";

#[derive(Debug, Clone, thiserror::Error)]
pub enum PropertiesError {
    #[error("{PROPERTIES_ENV}={path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{PROPERTIES_ENV}={path}, line {line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// `key=value` lines; blank lines and lines starting with `#` or `!` are
/// skipped. On error: the 1-based line and what is wrong with it.
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut props = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        if line.ends_with('\\') {
            return Err((i + 1, "continued lines are not supported".into()));
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((i + 1, format!("expected key=value, got {line:?}")));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err((i + 1, "empty property name".into()));
        }
        props.push((key.to_string(), value.trim().to_string()));
    }
    Ok(props)
}

/// The properties named by `FORGELOG_KAFKA_CONFIG` (none when it is unset),
/// read once per process. Binaries call it at start to refuse a broken file
/// with a clear message.
pub fn env_properties() -> Result<&'static [(String, String)], PropertiesError> {
    static PROPS: OnceLock<Result<Vec<(String, String)>, PropertiesError>> = OnceLock::new();
    let read = || {
        let Some(path) = std::env::var_os(PROPERTIES_ENV).map(PathBuf::from) else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(&path).map_err(|e| PropertiesError::Unreadable {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        parse_properties(&text).map_err(|(line, reason)| PropertiesError::Malformed {
            path,
            line,
            reason,
        })
    };
    match PROPS.get_or_init(read) {
        Ok(p) => Ok(p),
        Err(e) => Err(e.clone()),
    }
}

impl StreamConfig {
    /// Clients of `brokers`, with the `FORGELOG_KAFKA_CONFIG` properties when
    /// that file reads (a broken one is reported by [`env_properties`], which
    /// the binaries check before anything connects).
    pub fn new(brokers: impl Into<String>) -> StreamConfig {
        StreamConfig {
            brokers: brokers.into(),
            extra: env_properties().map(<[_]>::to_vec).unwrap_or_default(),
            claims: crate::claims::ClaimsConfig::from_env(),
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
    /// when to give up. Batches wait up to `linger` for more (the user's
    /// properties may say otherwise): each batch costs the client's broker
    /// thread a request per partition whatever its size. Where answers come
    /// slower than batches fall due (tansu under the proxy's load bench), a
    /// partition with 5 requests in flight, the idempotent limit, wakes the
    /// thread at once without sending: it polls with no wait until an answer
    /// comes.
    pub(crate) fn producer(&self, linger: std::time::Duration) -> ClientConfig {
        let mut c = self.client("forgelog-producer");
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", "0")
            .set("linger.ms", linger.as_millis().to_string())
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

#[cfg(test)]
mod tests {
    use super::parse_properties;

    #[test]
    fn properties_are_key_value_lines_with_comments() {
        let text = "# cluster\n\nsecurity.protocol = SASL_SSL\n! old style comment\nsasl.jaas.config=a=b c\nssl.ca.location=\n";
        assert_eq!(
            parse_properties(text).unwrap(),
            [
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.jaas.config".to_string(), "a=b c".to_string()),
                ("ssl.ca.location".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn a_malformed_line_is_named() {
        assert_eq!(
            parse_properties("a=1\nsasl.mechanism PLAIN\n")
                .unwrap_err()
                .0,
            2
        );
        assert_eq!(parse_properties("=x").unwrap_err().0, 1);
        assert_eq!(parse_properties("a=1\nb=2 \\\n  c").unwrap_err().0, 2);
    }
}
