//! `forgelog tail`: a topic's events as JSON lines.

use crate::BrokerArgs;
use anyhow::{bail, Result};
use forgelog_schemas::{Received, Topic};
use forgelog_stream::{ReplayReader, StartAt};
use std::io::Write;
use std::ops::ControlFlow;

#[derive(clap::Args)]
pub struct TailArgs {
    /// Topic name, e.g. forgelog.calls
    topic: String,
    /// Print the topic's history up to now and exit (default: follow new events)
    #[arg(long)]
    from_beginning: bool,
    /// Only events of this run
    #[arg(long, env = "FORGELOG_RUN")]
    run: Option<String>,
    /// Stop after this many events
    #[arg(long)]
    limit: Option<usize>,
    /// Each line as {"partition", "offset", "key", "event"}
    #[arg(long)]
    envelope: bool,
    #[command(flatten)]
    broker: BrokerArgs,
}

pub fn run(args: TailArgs) -> Result<()> {
    let TailArgs {
        topic,
        from_beginning,
        run,
        limit,
        envelope,
        broker,
    } = args;
    if Topic::from_name(&topic).is_none() {
        bail!(
            "unknown topic {topic:?}; forgelog's topics are: {}",
            Topic::ALL.map(|t| t.name()).join(", ")
        );
    }
    let reader = ReplayReader::new(&broker.config())?;
    let mut out = std::io::stdout().lock();
    let mut printed = 0usize;
    let mut write_err = None;
    let print = |rec: Received| {
        if limit.is_some_and(|l| printed >= l) || write_err.is_some() {
            return ControlFlow::Break(());
        }
        let line = match &rec.event {
            Ok(e) => {
                let mut event = serde_json::to_value(e).expect("events serialize to JSON");
                bodies_as_text(&mut event);
                if envelope {
                    let key = String::from_utf8_lossy(&rec.key);
                    serde_json::json!({"partition": rec.partition, "offset": rec.offset,
                                       "key": key, "event": event})
                    .to_string()
                } else {
                    event.to_string()
                }
            }
            Err(err) => {
                serde_json::json!({"error": err, "partition": rec.partition, "offset": rec.offset})
                    .to_string()
            }
        };
        if let Err(e) = writeln!(out, "{line}") {
            write_err = Some(e);
        }
        printed += 1;
        ControlFlow::Continue(())
    };
    if from_beginning {
        reader.for_each(&topic, StartAt::Beginning, run.as_deref(), print)?;
    } else {
        reader.follow(&topic, run.as_deref(), print)?;
    }
    match write_err {
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The request and response bodies a call records are bytes (JSON arrays of
/// numbers as serialized): printed as the text they almost always are.
fn bodies_as_text(event: &mut serde_json::Value) {
    for field in ["raw_request", "response_body"] {
        let Some(v) = event.get_mut(field) else {
            continue;
        };
        let bytes: Option<Vec<u8>> = v.as_array().and_then(|items| {
            items
                .iter()
                .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect()
        });
        if let Some(text) = bytes.and_then(|b| String::from_utf8(b).ok()) {
            *v = serde_json::Value::String(text);
        }
    }
}
