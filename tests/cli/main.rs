//! The `forgelog` binary against the real broker.

mod flags;
mod log;
mod run;
mod services;
mod up;

use forgelog_schemas::testing::call_finished;
use forgelog_schemas::Event;
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{EventProducer, SpoolOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn forgelog() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
}

fn sigterm(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}
