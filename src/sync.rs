//! `forgelog sync`: keep an engine serving the newest published policy.

use crate::BrokerArgs;
use anyhow::Result;

#[derive(Debug, Clone, clap::Args)]
pub struct SyncCmd {
    #[command(flatten)]
    pub sync: forgelog_sync::SyncArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

pub fn run(rt: &tokio::runtime::Runtime, cmd: SyncCmd) -> Result<()> {
    rt.block_on(async {
        let shutdown = forgelog_stream::shutdown_signal()?;
        forgelog_sync::run(cmd.sync, &cmd.broker.brokers, shutdown).await?;
        Ok(())
    })
}
