//! `forgelog spool drain|status`: a producer's local spool.

use crate::BrokerArgs;
use anyhow::Result;
use forgelog_stream::{EventProducer, Spool, SpoolOptions};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum SpoolAction {
    /// Send everything in the spool to the broker, then exit
    Drain {
        #[arg(long)]
        dir: PathBuf,
        /// Give up after this many seconds (what is left stays in the spool)
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Show how many events wait in the spool
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: SpoolAction) -> Result<()> {
    match action {
        SpoolAction::Drain {
            dir,
            timeout_secs,
            broker,
        } => rt.block_on(async {
            let producer = EventProducer::start(&broker.config(), &dir, SpoolOptions::default())?;
            let pending = producer.spool().pending();
            eprintln!("draining {pending} events from {}", dir.display());
            producer.close(Duration::from_secs(timeout_secs)).await?;
            eprintln!("spool {} is empty", dir.display());
            Ok(())
        }),
        SpoolAction::Status { dir } => {
            let spool = Spool::open(&dir, SpoolOptions::default())?;
            println!(
                "pending events: {}\nacknowledged through seq: {}\nbytes on disk: {}",
                spool.pending(),
                spool.acked(),
                spool.bytes()
            );
            Ok(())
        }
    }
}
