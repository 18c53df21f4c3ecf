//! Where a per-run command reads its run: the log (`--brokers`), or a bundle
//! file `forgelog export bundle` wrote (`--bundle`), which needs no broker.

use crate::BrokerArgs;
use anyhow::{bail, Result};
use forgelog_stream::{Bundle, ConsumeError, LogReader, Received, ReplayReader};
use std::ops::ControlFlow;
use std::path::PathBuf;

/// The log, or a bundle in its place.
#[derive(clap::Args, Clone, Debug)]
pub struct SourceArgs {
    /// Read the run from this bundle (`forgelog export bundle`) instead of the log
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

/// A run's events as a [`LogReader`]: from the log or from a bundle.
pub enum RunLog {
    Log(ReplayReader),
    Bundle(Bundle),
}

impl SourceArgs {
    /// Opens the source of `run`: a bundle of another run is refused.
    pub fn open(&self, run: &str) -> Result<RunLog> {
        match &self.bundle {
            None => Ok(RunLog::Log(ReplayReader::new(&self.broker.config())?)),
            Some(path) => {
                let bundle = Bundle::open(path)?;
                if bundle.run() != run {
                    bail!("{} holds run {}, not {run}", path.display(), bundle.run());
                }
                Ok(RunLog::Bundle(bundle))
            }
        }
    }

    /// Opens the source of `run`, or of every run in the log (a bundle's
    /// one run where none is named); which run is read, if one.
    pub fn open_any(&self, run: Option<&str>) -> Result<(RunLog, Option<String>)> {
        match (run, &self.bundle) {
            (Some(run), _) => Ok((self.open(run)?, Some(run.to_string()))),
            (None, None) => Ok((RunLog::Log(ReplayReader::new(&self.broker.config())?), None)),
            (None, Some(path)) => {
                let bundle = Bundle::open(path)?;
                let run = bundle.run().to_string();
                Ok((RunLog::Bundle(bundle), Some(run)))
            }
        }
    }

    /// Where the run was read from, in words.
    pub fn describe(&self) -> String {
        match &self.bundle {
            Some(path) => format!("the bundle {}", path.display()),
            None => format!("the log at {}", self.broker.brokers),
        }
    }
}

impl LogReader for RunLog {
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError> {
        match self {
            RunLog::Log(r) => r.partitions(topic),
            RunLog::Bundle(b) => b.partitions(topic),
        }
    }

    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        match self {
            RunLog::Log(r) => LogReader::end(r, topic, partition),
            RunLog::Bundle(b) => b.end(topic, partition),
        }
    }

    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        match self {
            RunLog::Log(r) => LogReader::for_each_in(r, topic, partition, from, to, f),
            RunLog::Bundle(b) => b.for_each_in(topic, partition, from, to, f),
        }
    }

    fn for_each_of_run(
        &self,
        topic: &str,
        run: &str,
        f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<(), ConsumeError> {
        match self {
            RunLog::Log(r) => r.for_each_of_run(topic, run, f),
            RunLog::Bundle(b) => b.for_each_of_run(topic, run, f),
        }
    }
}
