//! `forgelog broker`: the local Kafka-protocol broker (tansu) in the foreground.

use anyhow::{Context, Result};
use forgelog_stream::broker::{self, LocalBroker};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct BrokerCmd {
    /// Data directory (SQLite database and log)
    #[arg(long, default_value = ".forgelog/broker")]
    data: PathBuf,
    /// Where the broker listens for Kafka clients
    #[arg(long, default_value = forgelog_stream::DEFAULT_BROKERS)]
    listen: SocketAddr,
}

/// Starts tansu (building it first if it is not installed) on `listen`.
pub fn start_local_broker(data: &Path, listen: SocketAddr) -> Result<LocalBroker> {
    let binary = broker::find_or_install_tansu()?;
    LocalBroker::start(&binary, data, listen)
        .with_context(|| format!("starting {}", binary.display()))
}

/// Runs the broker until Ctrl-C or SIGTERM, then stops tansu cleanly.
pub fn run(rt: &tokio::runtime::Runtime, cmd: BrokerCmd) -> Result<()> {
    let BrokerCmd { data, listen } = cmd;
    let mut b = start_local_broker(&data, listen)?;
    eprintln!(
        "forgelog broker: tansu on {listen}, data in {} (Ctrl-C to stop)",
        data.display()
    );
    let pid = b.pid();
    let status = std::thread::scope(|s| {
        let waiter = s.spawn(|| b.wait());
        rt.block_on(async {
            let stop = forgelog_stream::shutdown_signal()?;
            tokio::select! {
                _ = stop => {}
                _ = async { while !waiter.is_finished() { tokio::time::sleep(Duration::from_millis(200)).await } } => {}
            }
            anyhow::Ok(())
        })?;
        broker::terminate(pid);
        waiter
            .join()
            .map_err(|_| anyhow::anyhow!("broker waiter panicked"))?
            .map_err(anyhow::Error::from)
    })?;
    eprintln!("forgelog broker: stopped ({status})");
    Ok(())
}
