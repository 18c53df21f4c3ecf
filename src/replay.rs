//! `forgelog replay rebuild|serve|show`.

use crate::source::SourceArgs;
use anyhow::{bail, Result};
use forgelog_consumers::{rebuild, show, RewardConfig};
use forgelog_schemas::Topic;

#[derive(clap::Subcommand)]
pub enum ReplayAction {
    /// Re-derive trajectories and batches from calls, rollouts and rewards; compare with the output topics
    #[command(after_help = "Example:\n  forgelog replay rebuild --run demo-1 --json")]
    Rebuild {
        /// The recorded run
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// The reward join ran with --efficiency-bonus
        #[arg(long)]
        efficiency_bonus: bool,
        /// One JSON object ({run, identical, trajectories, batches, difference}) instead of the line
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// A proxy answering from a recorded run instead of the engine: a re-running harness gets the recorded responses call by call
    #[command(
        after_help = "Example:\n  forgelog replay serve --run demo-1 --listen 127.0.0.1:8100"
    )]
    Serve(forgelog_producers::ReplayServeArgs),
    /// Print a run's trajectory trees: branches, discarded retries, sub-agent roots, mask spans, rewards
    #[command(after_help = "Example:\n  forgelog replay show --run demo-1 --rollout demo-1-g0-r0")]
    Show {
        /// The recorded run
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// Only this rollout
        #[arg(long)]
        rollout: Option<String>,
        #[command(flatten)]
        source: SourceArgs,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: ReplayAction) -> Result<()> {
    match action {
        ReplayAction::Rebuild {
            run,
            efficiency_bonus,
            json,
            source,
        } => {
            let reader = source.open_known(&run)?;
            let working =
                crate::spinner(format!("rebuilding run {run} from {}", source.describe()));
            let rewards = RewardConfig::with_efficiency_bonus(efficiency_bonus);
            let (rebuilt, diff) = rebuild::rebuild_and_compare(&reader, &run, rewards)?;
            working.finish_and_clear();
            if json {
                let difference = diff.as_ref().map(|d| {
                    serde_json::json!({
                        "topic": d.topic.name(),
                        "event": d.event,
                        "event_id": d.event_id,
                        "field": d.field,
                        "partition": d.stored_at.map(|(p, _)| p),
                        "offset": d.stored_at.map(|(_, o)| o),
                        "detail": d.detail,
                    })
                });
                let out = serde_json::json!({
                    "run": run,
                    "identical": diff.is_none(),
                    "trajectories": rebuilt.trajectories.len(),
                    "batches": rebuilt.batches.len(),
                    "difference": difference,
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
                return match diff {
                    None => Ok(()),
                    Some(_) => {
                        Err(crate::Found(format!("run {run} differs from its rebuild")).into())
                    }
                };
            }
            match diff {
                None => {
                    println!(
                        "identical: {} trajectories, {} batches of run {run}",
                        rebuilt.trajectories.len(),
                        rebuilt.batches.len()
                    );
                    Ok(())
                }
                Some(d) => Err(crate::Found(format!("differs: {d}")).into()),
            }
        }
        ReplayAction::Serve(args) => Ok(rt.block_on(forgelog_producers::run_replay(args))?),
        ReplayAction::Show {
            run,
            rollout,
            source,
        } => {
            let reader = source.open(&run)?;
            let mut events = Vec::new();
            for topic in [Topic::Trajectories, Topic::Batches] {
                let read = rebuild::read_run(&reader, topic, &run)?;
                events.extend(read.into_iter().filter_map(|r| r.event.ok()));
            }
            let (text, shown) = show::render_run(&events, rollout.as_deref());
            if shown == 0 {
                bail!(
                    "no trajectories for run {run}{}",
                    rollout
                        .map(|r| format!(", rollout {r}"))
                        .unwrap_or_default()
                );
            }
            print!("{text}");
            Ok(())
        }
    }
}
