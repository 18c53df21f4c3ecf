//! `forgelog spool drain|status`: a producer's local spool.

use crate::BrokerArgs;
use anyhow::Result;
use forgelog_stream::{EventProducer, SpoolOptions, SpoolStatus};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum SpoolAction {
    /// Send everything in the spool to the broker, then exit
    #[command(after_help = "Example:\n  forgelog spool drain --dir .forgelog/proxy-spool")]
    Drain {
        /// The spool directory (a proxy's --spool)
        #[arg(long)]
        dir: PathBuf,
        /// Give up after this many seconds (what is left stays in the spool)
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Show how many events wait in the spool
    #[command(after_help = "Example:\n  forgelog spool status --dir .forgelog/proxy-spool --json")]
    Status {
        /// The spool directory (a proxy's --spool)
        #[arg(long)]
        dir: PathBuf,
        /// One JSON object instead of the text
        #[arg(long)]
        json: bool,
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
            let parked = SpoolStatus::read(&dir)?.parked.len();
            if parked > 0 {
                eprintln!("{parked} records the broker refused for good are parked: forgelog spool status --dir {}", dir.display());
            }
            Ok(())
        }),
        SpoolAction::Status { dir, json } => {
            // Read-only: safe beside the proxy that is writing this spool.
            let s = SpoolStatus::read(&dir)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(());
            }
            println!(
                "pending events: {}\nacknowledged through seq: {}\nbytes on disk: {}\nin use: {}",
                s.pending,
                s.acked_through,
                s.bytes,
                if s.in_use { "yes (a producer holds it)" } else { "no" }
            );
            if s.incomplete_tail > 0 {
                println!(
                    "incomplete last record: {} bytes (being written, or torn by a crash: cut on the next open)",
                    s.incomplete_tail
                );
            }
            println!("parked (refused by the broker for good): {}", s.parked.len());
            for p in &s.parked {
                println!(
                    "  seq {} topic {} ({} bytes): {}  [{}/parked/{:020}.rec]",
                    p.seq,
                    p.topic,
                    p.bytes,
                    p.reason,
                    dir.display(),
                    p.seq
                );
            }
            Ok(())
        }
    }
}
