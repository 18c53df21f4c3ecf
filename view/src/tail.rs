//! Reading the log into the viewer's index, from the start and then as it grows.

use forgelog_schemas::{Event, Topic};
use forgelog_stream::{ConsumeError, LogReader};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

/// Where the viewer has read to, per topic partition, in the log or a bundle.
pub struct LogTail<R> {
    reader: R,
    run: Option<String>,
    next: BTreeMap<(&'static str, i32), i64>,
    /// Topics whose first read is done (a run's first read seeks).
    begun: BTreeSet<&'static str>,
}

impl<R: LogReader> LogTail<R> {
    /// A tail of every run `reader` holds, or of `run` only.
    pub fn new(reader: R, run: Option<String>) -> LogTail<R> {
        LogTail {
            reader,
            run,
            next: BTreeMap::new(),
            begun: BTreeSet::new(),
        }
    }

    /// The log (or bundle) it reads.
    pub fn log(&self) -> &R {
        &self.reader
    }

    /// Hands `f` every event written since the last poll (all of them on the
    /// first), topic by topic, each partition in offset order; returns how many.
    /// Messages that are not forgelog events are skipped: the consumers
    /// dead-letter them, the viewer only shows what it can read.
    pub fn poll(&mut self, mut f: impl FnMut(Event)) -> Result<usize, ConsumeError> {
        let mut read = 0;
        let mut hand_on = |event| {
            read += 1;
            f(event)
        };
        for topic in Topic::ALL {
            let name = topic.name();
            match self.run.clone() {
                Some(run) if self.begun.insert(name) => {
                    self.first_read(name, &run, &mut hand_on)?
                }
                _ => self.read_on(name, &mut hand_on)?,
            }
        }
        Ok(read)
    }

    /// One run's first read of `topic`: from where the run index says the run
    /// starts (the one per-run reader), up to the ends the partitions have now.
    fn first_read(
        &mut self,
        name: &'static str,
        run: &str,
        f: &mut impl FnMut(Event),
    ) -> Result<(), ConsumeError> {
        let mut ends = BTreeMap::new();
        for partition in self.reader.partitions(name)? {
            ends.insert(partition, self.reader.end(name, partition)?);
        }
        // What arrived past those ends is the next poll's.
        let next = &mut self.next;
        let result = self.reader.for_each_of_run(name, run, |rec| {
            if ends
                .get(&rec.partition)
                .is_some_and(|&end| rec.offset < end)
            {
                next.insert((name, rec.partition), rec.offset + 1);
                if let Ok(event) = rec.event {
                    f(event);
                }
            }
            ControlFlow::Continue(())
        });
        // Done: every partition is read to its end. Failed halfway: a
        // partition resumes after the last event handed on, or (none handed
        // on) from its start; none is handed on twice.
        if result.is_ok() {
            for (partition, end) in ends {
                next.insert((name, partition), end);
            }
        }
        result
    }

    /// `topic` from where the last read stopped to the ends it has now.
    fn read_on(
        &mut self,
        name: &'static str,
        f: &mut impl FnMut(Event),
    ) -> Result<(), ConsumeError> {
        let run = self.run.as_deref();
        for partition in self.reader.partitions(name)? {
            let hi = self.reader.end(name, partition)?;
            let from = self.next.get(&(name, partition)).copied().unwrap_or(0);
            // Where a read fails halfway, the next poll resumes after the
            // last event handed on: none is handed on twice.
            let mut upto = from;
            let result = self.reader.for_each_in(name, partition, from, hi, |rec| {
                upto = rec.offset + 1;
                if let (true, Ok(event)) = (rec.in_run(run), rec.event) {
                    f(event);
                }
                ControlFlow::Continue(())
            });
            let done = if result.is_ok() { hi } else { upto };
            self.next.insert((name, partition), done);
            let _ = result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::testing::recorded_run;
    use forgelog_stream::MemoryLog;

    fn run_ids(events: &[Event]) -> Vec<String> {
        events.iter().map(|e| e.run_id().to_string()).collect()
    }

    /// One run's tail hands on that run's events once each: all of them at
    /// first, then only what arrived since, never another run's.
    #[test]
    fn a_runs_tail_hands_on_its_events_once_each_as_they_arrive() {
        let log = MemoryLog::new(3);
        let ours = recorded_run("ours", 2, 2, 2, 4);
        let theirs = recorded_run("theirs", 2, 2, 2, 4);
        let (first, later) = ours.split_at(ours.len() / 2);
        for e in theirs
            .iter()
            .take(5)
            .chain(first)
            .chain(theirs.iter().skip(5))
        {
            log.append(e).unwrap();
        }
        let mut tail = LogTail::new(log, Some("ours".to_string()));
        let mut seen = Vec::new();
        assert_eq!(tail.poll(|e| seen.push(e)).unwrap(), first.len());
        for e in later.iter().chain(&theirs) {
            tail.log().append(e).unwrap();
        }
        assert_eq!(tail.poll(|e| seen.push(e)).unwrap(), later.len());
        assert_eq!(tail.poll(|e| seen.push(e)).unwrap(), 0);
        assert!(run_ids(&seen).iter().all(|r| r == "ours"));
        let mut want: Vec<String> = ours.iter().map(|e| e.event_id().to_string()).collect();
        let mut got: Vec<String> = seen.iter().map(|e| e.event_id().to_string()).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);
    }

    /// A tail of every run reads them all.
    #[test]
    fn a_tail_of_every_run_reads_them_all() {
        let log = MemoryLog::new(2);
        let events: Vec<Event> = ["a", "b"]
            .iter()
            .flat_map(|r| recorded_run(r, 1, 2, 1, 3))
            .collect();
        for e in &events {
            log.append(e).unwrap();
        }
        let mut tail = LogTail::new(log, None);
        assert_eq!(tail.poll(|_| {}).unwrap(), events.len());
        assert_eq!(tail.poll(|_| {}).unwrap(), 0);
    }
}
