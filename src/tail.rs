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
        let line = rec.json_line(envelope);
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
