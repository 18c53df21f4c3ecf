//! `forgelog run TASKS_DIR --replay R`: re-runs the recorded rollouts of run
//! R (`forgelog_stack::Replay`) and prints how each re-run ended against its
//! recording and the replay report of every call that differed. Exit 1 when
//! anything differs unexplained.

use super::RunArgs;
use crate::source::SourceArgs;
use crate::Found;
use anyhow::{bail, Context, Result};
use forgelog_deploy_core::ReplayTable;
use forgelog_producers::replay::{report_text, Matching, Normaliser};
use forgelog_stack::{Replay, ReplayConfig};

pub fn replay(rt: &tokio::runtime::Runtime, args: &RunArgs, run: &str) -> Result<()> {
    if args.backend != "local" {
        bail!("--replay re-runs rollouts in local sandboxes (--backend local)");
    }
    let source = SourceArgs {
        bundle: args.bundle.clone(),
        broker: args.broker.clone(),
    };
    let matching = match args.strict {
        true => Matching::Strict,
        false => {
            Matching::Lenient(Normaliser::with_volatile(&args.volatile).context("--volatile")?)
        }
    };
    let config = ReplayConfig {
        run: run.to_string(),
        tasks_dir: args.tasks_dir.clone(),
        rollouts: args.rollouts.clone(),
        matching,
        pin_clock: args.pin_clock,
        concurrency: args.concurrency,
        proxy_listen: args.proxy_listen,
        home: forgelog_stream::forgelog_home(),
    };
    let replay = Replay::read(&source.open(run)?, config)?;
    for line in &replay.warnings {
        eprintln!("warning: {line}");
    }
    let (total, pinned) = (replay.rollouts(), replay.pinned());
    let bar = super::progress::Bar::new(total);
    let replayed = rt.block_on(async {
        let started = |url: &str| {
            eprintln!(
                "replaying run {run}: {total} rollouts, {} at a time, from the recording at {url}{}",
                args.concurrency,
                if pinned { ", clocks pinned at each recorded start" } else { "" }
            )
        };
        let stop = forgelog_stream::shutdown_signal()?;
        anyhow::Ok(replay.run(&bar, started, stop).await?)
    });
    bar.bar.finish();
    let replayed = replayed?;
    println!("\nreplay of run {run}\n{}", ReplayTable(&replayed.attempts));
    print!("{}", report_text(&replayed.divergences));
    println!("{} calls had no recorded answer", replayed.refused.len());
    for r in &replayed.refused {
        println!("  {r}");
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&replayed.to_json(run))?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if !replayed.same() {
        return Err(Found(format!(
            "the replay of run {run} differs: {} rollouts ended differently, {} calls differed unexplained, {} had no recorded answer",
            replayed.differing(),
            replayed.unexplained(),
            replayed.refused.len()
        ))
        .into());
    }
    println!("the replay of run {run} did what the recording did: {total} rollouts");
    Ok(())
}
