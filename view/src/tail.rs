//! Reading the log into the viewer's index, from the start and then as it grows.

use forgelog_schemas::{Event, Topic};
use forgelog_stream::{ConsumeError, ReplayReader, StreamConfig};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// Where the viewer has read to, per topic partition.
pub struct LogTail {
    reader: ReplayReader,
    run: Option<String>,
    next: BTreeMap<(&'static str, i32), i64>,
}

impl LogTail {
    /// A tail of every run, or of `run` only.
    pub fn new(config: &StreamConfig, run: Option<String>) -> Result<LogTail, ConsumeError> {
        Ok(LogTail {
            reader: ReplayReader::new(config)?,
            run,
            next: BTreeMap::new(),
        })
    }

    /// Hands `f` every event written since the last poll (all of them on the
    /// first), topic by topic, each partition in offset order; returns how many.
    /// Messages that are not forgelog events are skipped: the consumers
    /// dead-letter them, the viewer only shows what it can read.
    pub fn poll(&mut self, mut f: impl FnMut(Event)) -> Result<usize, ConsumeError> {
        let mut read = 0;
        for topic in Topic::ALL {
            let name = topic.name();
            for partition in self.reader.partitions(name)? {
                let (lo, hi) = self.reader.watermarks(name, partition)?;
                let from = self
                    .next
                    .get(&(name, partition))
                    .copied()
                    .unwrap_or(lo)
                    .max(lo);
                let run = self.run.as_deref();
                // Where a read fails halfway, the next poll resumes after the
                // last event handed on: none is handed on twice.
                let mut upto = from;
                let result = self.reader.for_each_in(name, partition, from, hi, |rec| {
                    upto = rec.offset + 1;
                    if let (true, Ok(event)) = (rec.in_run(run), rec.event) {
                        read += 1;
                        f(event);
                    }
                    ControlFlow::Continue(())
                });
                let done = if result.is_ok() { hi } else { upto };
                self.next.insert((name, partition), done);
                let _ = result?;
            }
        }
        Ok(read)
    }
}
