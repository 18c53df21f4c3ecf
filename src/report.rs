//! `forgelog report --run R`: the run per policy version and harness, and
//! each published version's training step, from the log alone.

use crate::source::SourceArgs;
use anyhow::{bail, Context, Result};
use forgelog_consumers::core::report::Report;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::LogReader;

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The run
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: String,
    /// Also write the report with its plots (reward and pass rate per version per harness, IS ratio, staleness, loss) as one self-contained HTML page here
    #[arg(long)]
    pub html: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// The run's events on every topic.
pub fn run_events(reader: &impl LogReader, run: &str) -> Result<Vec<Event>> {
    Ok(reader.run_events(run, &Topic::ALL)?)
}

pub fn run(args: ReportArgs) -> Result<()> {
    let reader = args.source.open(&args.run)?;
    let events = run_events(&reader, &args.run)?;
    if events.is_empty() {
        bail!(
            "run {} has no events in {}",
            args.run,
            args.source.describe()
        );
    }
    let report = Report::of(&events);
    println!("run {}\n{report}", args.run);
    if let Some((first, last)) = report.first_and_last(5) {
        println!("reward first 5 versions: {first:.3}, last 5 versions: {last:.3}");
    }
    if let Some(path) = &args.html {
        let page = forgelog_view::Pages::new().report(&args.run, &events)?;
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report: {}", path.display());
    }
    Ok(())
}
