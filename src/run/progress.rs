//! The progress bar of `forgelog run`: rollouts done, and per harness how
//! many are running, done and unscored.

use forgelog_deploy::orchestrator::Progress;
use forgelog_deploy_core::{Outcome, Rollout};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Counts per harness for the progress bar's message.
#[derive(Default)]
struct Counts {
    running: usize,
    done: usize,
    unscored: usize,
}

pub struct Bar {
    pub bar: indicatif::ProgressBar,
    counts: Mutex<BTreeMap<String, Counts>>,
}

impl Bar {
    pub fn new(total: usize) -> Bar {
        let bar = indicatif::ProgressBar::new(total as u64).with_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} rollouts  {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Bar {
            bar,
            counts: Mutex::default(),
        }
    }

    fn update(&self, harness: &str, f: impl FnOnce(&mut Counts)) {
        let mut counts = self.counts.lock().expect("progress lock");
        f(counts.entry(harness.to_string()).or_default());
        let msg: Vec<String> = counts
            .iter()
            .map(|(h, c)| {
                format!(
                    "{h}: {} done, {} running, {} unscored",
                    c.done, c.running, c.unscored
                )
            })
            .collect();
        self.bar.set_message(msg.join(" | "));
    }
}

impl Progress for Bar {
    fn started(&self, rollout: &Rollout) {
        self.update(&rollout.harness, |c| c.running += 1);
    }

    fn finished(&self, o: &Outcome) {
        let unscored = o
            .status
            .is_some_and(|s| s != forgelog_deploy_core::RolloutStatus::Scored);
        self.update(&o.harness, |c| {
            if o.status.is_some() {
                c.running = c.running.saturating_sub(1);
            }
            c.done += 1;
            c.unscored += usize::from(unscored);
        });
        self.bar.inc(1);
    }
}
