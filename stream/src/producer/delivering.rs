//! An rdkafka producer whose delivery reports complete futures.
//!
//! rdkafka's `FutureProducer` does the same, but its polling thread waits in
//! 100 ms rounds and spins through the last millisecond of each one (the time
//! left is rounded down to 0 ms and polled without waiting): about 10 ms of CPU
//! every second, busy or idle, which was a tenth of the proxy's CPU at 100
//! calls/s. Here the thread waits in 1 s rounds, so the spin is 1 ms in 1,000.

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, Message};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

const POLL_ROUND: Duration = Duration::from_secs(1);

/// Where the broker put a message, or why it did not.
pub(super) type Delivery = Result<(i32, i64), rdkafka::error::KafkaError>;

/// Sends each delivery report to the future waiting for it.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<Delivery>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiter: Self::DeliveryOpaque) {
        let delivery = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.clone()),
        };
        // The waiter may be gone (its session ended): nothing to tell then.
        let _ = waiter.send(delivery);
    }
}

pub(super) struct DeliveringProducer {
    producer: Arc<BaseProducer<Reports>>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl DeliveringProducer {
    pub(super) fn create(config: &ClientConfig) -> KafkaResult<Self> {
        let producer: Arc<BaseProducer<Reports>> = Arc::new(config.create_with_context(Reports)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (producer.clone(), stop.clone());
        // Not joined on drop: it notices `stop` within a round, then lets the
        // client go (its own drop purges what is left).
        let poller = std::thread::Builder::new()
            .name("kafka-deliveries".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    p.poll(POLL_ROUND);
                }
            })
            .map_err(|e| {
                rdkafka::error::KafkaError::ClientCreation(format!("polling thread: {e}"))
            })?;
        Ok(DeliveringProducer {
            producer,
            stop,
            poller: Some(poller),
        })
    }

    /// Queues one message; the future resolves with its delivery report
    /// (`None` if the report never comes, as when the client is gone).
    pub(super) fn send(
        &self,
        topic: &str,
        key: &[u8],
        value: &[u8],
    ) -> KafkaResult<impl Future<Output = Option<Delivery>> + Send + 'static> {
        let (tx, rx) = oneshot::channel();
        let record = BaseRecord::with_opaque_to(topic, Box::new(tx))
            .key(key)
            .payload(value);
        self.producer.send(record).map_err(|(e, _)| e)?;
        Ok(async move { rx.await.ok() })
    }

    /// Drops what is queued or in flight, then waits (blocking, up to a poll
    /// round) until the client is gone: afterwards nothing of this producer
    /// reaches the broker but requests already on the wire.
    pub(super) fn shut_down(mut self) {
        self.producer
            .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        let poller = self.poller.take();
        drop(self); // the polling thread now holds the last handle to the client
        if let Some(poller) = poller {
            let _ = poller.join();
        }
    }
}

impl Drop for DeliveringProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
