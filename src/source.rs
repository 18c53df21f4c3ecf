//! Where a per-run command reads its run: the log (`--brokers`), or a bundle
//! file `forgelog export bundle` wrote (`--bundle`), which needs no broker.

use crate::BrokerArgs;
use anyhow::{bail, Result};
use forgelog_schemas::Topic;
use forgelog_stream::RunLog;
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

impl SourceArgs {
    /// Opens the source of `run`: a bundle of another run is refused.
    pub fn open(&self, run: &str) -> Result<RunLog> {
        Ok(RunLog::open(
            &self.broker.config(),
            self.bundle.as_deref(),
            run,
        )?)
    }

    /// Opens the source of `run`, which must have started rollouts there:
    /// an unknown run is a typo, not an empty dataset or an identical rebuild
    /// (`replay rebuild` of one said "identical: 0 trajectories").
    pub fn open_known(&self, run: &str) -> Result<RunLog> {
        let reader = self.open(run)?;
        let rollouts = forgelog_consumers::rebuild::read_run(&reader, Topic::Rollouts, run)?;
        if rollouts.is_empty() {
            bail!(
                "run {run} has no rollouts in {} (a typo? `forgelog tail forgelog.rollouts` lists runs)",
                self.describe()
            );
        }
        Ok(reader)
    }

    /// Opens the source of `run`, or of every run in the log (a bundle's
    /// one run where none is named); which run is read, if one.
    pub fn open_any(&self, run: Option<&str>) -> Result<(RunLog, Option<String>)> {
        match run {
            Some(run) => Ok((self.open(run)?, Some(run.to_string()))),
            None => Ok(RunLog::open_any(
                &self.broker.config(),
                self.bundle.as_deref(),
            )?),
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
