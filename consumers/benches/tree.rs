//! `cargo bench -p forgelog-consumers`: the tree builder's pure core in tokens/s,
//! then both consumers end to end against a private tansu broker.

use forgelog_consumers::{shell, RewardJoin, ShellOptions, TrajectoryBuilder, TrajectoryTree};
use forgelog_schemas::{testing, CallFinished};
use forgelog_stream::testing::PrivateBroker;
use std::time::Instant;

/// A 50-call session: each call's prompt is the previous prompt, its sampled
/// tokens and `turn` new harness tokens; every tenth call is retried once.
fn session(calls: usize, turn: usize) -> Vec<CallFinished> {
    let mut out = Vec::new();
    let mut context: Vec<u32> = (0..turn as u32).collect();
    for i in 0..calls {
        let mut c = testing::call_finished("bench", "s", out.len() as i64, 0, 0);
        c.prompt_token_ids = context.clone();
        c.completion_token_ids = (0..256).map(|t| (t * 7 + i as u32) % 49_152).collect();
        c.completion_logprobs = vec![-0.5; 256];
        if i % 10 == 9 {
            let mut retry = c.clone();
            retry.call_index += 1;
            c.completion_token_ids[0] += 1;
            out.push(c);
            c = retry;
        }
        context.extend_from_slice(&c.completion_token_ids);
        context.extend((0..turn as u32).map(|t| (t * 13 + i as u32) % 49_152));
        out.push(c);
    }
    out
}

fn main() {
    for (calls, turn) in [(50, 4_000), (50, 400)] {
        let s = session(calls, turn);
        let tokens: usize = s
            .iter()
            .map(|c| c.prompt_token_ids.len() + c.completion_token_ids.len())
            .sum();
        let iters = 5;
        let t = Instant::now();
        for _ in 0..iters {
            let tree = TrajectoryTree::build(&s);
            std::hint::black_box(tree.sequences());
        }
        let secs = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "tree build, {} calls (+{turn} tokens/turn, last prompt {} tokens): {:.1} M tokens/s ({tokens} tokens in {:.1} ms)",
            s.len(),
            s.last().unwrap().prompt_token_ids.len(),
            tokens as f64 / secs / 1e6,
            secs * 1e3
        );
    }

    let broker = match PrivateBroker::start() {
        Ok(b) => b,
        Err(e) => {
            println!("end to end: skipped ({e})");
            return;
        }
    };
    let config = broker.config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let events = testing::recorded_run("bench", 100, 8, 5, 200);
    let calls = events
        .iter()
        .filter(|e| matches!(e, forgelog_schemas::Event::CallFinished(_)))
        .count();
    rt.block_on(forgelog_stream::testing::produce(&config, &events));
    let state = tempfile::tempdir().unwrap();
    let opts = |name: &str, snapshot_every: usize| ShellOptions {
        exit_when_idle: true,
        snapshot_every,
        ..ShellOptions::new(state.path().join(name))
    };
    rt.block_on(async {
        // The same input twice: the state written whole at every checkpoint
        // (as before snapshots) and the default (positions at every checkpoint,
        // a snapshot every `SNAPSHOT_EVERY`). Only the first run's outputs are
        // new; the second derives the same and finds them in the log.
        for (name, snapshot_every) in [("whole", 1), ("trajectories", shell::SNAPSHOT_EVERY)] {
            let (c, o) = (config.clone(), opts(name, snapshot_every));
            let t = Instant::now();
            let stats = tokio::task::spawn_blocking(move || shell::run(&c, TrajectoryBuilder::default(), &o)).await.unwrap().unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "trajectories end to end, a snapshot every {snapshot_every} checkpoint(s): {} events ({calls} calls) in {secs:.2}s = {:.0} events/s, {} trajectories; state written {:.1} kB",
                stats.consumed,
                stats.consumed as f64 / secs,
                stats.emitted + stats.skipped,
                stats.state_bytes as f64 / 1e3
            );
        }
        let (c, o) = (config.clone(), opts("rewards", shell::SNAPSHOT_EVERY));
        let t = Instant::now();
        let stats = tokio::task::spawn_blocking(move || shell::run(&c, RewardJoin::default(), &o)).await.unwrap().unwrap();
        let secs = t.elapsed().as_secs_f64();
        println!(
            "reward join end to end: {} events in {secs:.2}s = {:.0} events/s, {} groups; state written {:.1} kB",
            stats.consumed,
            stats.consumed as f64 / secs,
            stats.emitted,
            stats.state_bytes as f64 / 1e3
        );
    });
}
