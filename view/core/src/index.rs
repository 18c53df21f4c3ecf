//! What the viewer has read of the log, by run.

use forgelog_schemas::Event;
use std::collections::BTreeMap;

/// One run's events in the order they were read (the log's order within a
/// partition), with the bytes no page shows left out.
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    pub events: Vec<Event>,
}

/// Every run read so far.
#[derive(Debug, Clone, Default)]
pub struct ViewIndex {
    runs: BTreeMap<String, RunLog>,
    /// Events taken in: pages and live updates change when this does.
    generation: u64,
}

impl ViewIndex {
    /// Adds one event. Raw request and response bytes, and the sequences a
    /// training batch repeats from the trajectories, are dropped: the viewer
    /// shows the chat view and the trees, and a 1,000-rollout run must fit.
    pub fn ingest(&mut self, mut event: Event) {
        match &mut event {
            Event::CallStarted(_) | Event::DeadLetter(_) => return,
            Event::CallFinished(c) => c.response_body = Vec::new(),
            Event::TrainingBatch(b) => b.members.iter_mut().for_each(|m| m.sequences.clear()),
            _ => {}
        }
        self.generation += 1;
        self.runs
            .entry(event.run_id().to_string())
            .or_default()
            .events
            .push(event);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Run ids, sorted.
    pub fn runs(&self) -> impl Iterator<Item = (&str, &RunLog)> {
        self.runs.iter().map(|(id, log)| (id.as_str(), log))
    }

    pub fn run(&self, run: &str) -> Option<&RunLog> {
        self.runs.get(run)
    }

    /// Events read of one run: a live page reloads when this grows.
    pub fn run_events(&self, run: &str) -> usize {
        self.runs.get(run).map_or(0, |r| r.events.len())
    }
}
