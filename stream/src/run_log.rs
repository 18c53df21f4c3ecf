//! A run's events from the log or from a bundle file (`forgelog export
//! bundle`), which needs no broker: one [`LogReader`] for every per-run
//! command.

use crate::{Bundle, BundleError, ConsumeError, LogReader, Received, ReplayReader, StreamConfig};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// A run's events as a [`LogReader`]: from the log or from a bundle.
pub enum RunLog {
    Log(ReplayReader),
    Bundle(Bundle),
}

/// Why a run's events cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    #[error(transparent)]
    Log(#[from] ConsumeError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("{} holds run {holds}, not {wanted}", path.display())]
    OtherRun {
        path: PathBuf,
        holds: String,
        wanted: String,
    },
}

impl RunLog {
    /// `run` from the bundle at `bundle`, or from the log at `config`
    /// without one: a bundle of another run is refused.
    pub fn open(
        config: &StreamConfig,
        bundle: Option<&Path>,
        run: &str,
    ) -> Result<RunLog, RunLogError> {
        let (log, holds) = RunLog::open_any(config, bundle)?;
        match (holds, bundle) {
            (Some(holds), Some(path)) if holds != run => Err(RunLogError::OtherRun {
                path: path.to_path_buf(),
                holds,
                wanted: run.to_string(),
            }),
            _ => Ok(log),
        }
    }

    /// The bundle at `bundle` and the one run it holds, or every run in the
    /// log at `config` without one.
    pub fn open_any(
        config: &StreamConfig,
        bundle: Option<&Path>,
    ) -> Result<(RunLog, Option<String>), RunLogError> {
        match bundle {
            None => Ok((RunLog::Log(ReplayReader::new(config)?), None)),
            Some(path) => {
                let bundle = Bundle::open(path)?;
                let run = bundle.run().to_string();
                Ok((RunLog::Bundle(bundle), Some(run)))
            }
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
