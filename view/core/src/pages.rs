//! The viewer's HTML: minijinja templates compiled into the binary.

use crate::model::{self, RunLine};
use crate::{RunLog, TokenText, ViewIndex};
use minijinja::{context, Environment};

/// The stylesheet and the live-update script, served as they are.
pub const STYLE: &str = include_str!("templates/view.css");
pub const SCRIPT: &str = include_str!("templates/view.js");

#[derive(Debug, thiserror::Error)]
#[error("rendering {page}: {source}")]
pub struct PageError {
    page: &'static str,
    source: minijinja::Error,
}

impl PageError {
    pub(crate) fn new(page: &'static str, source: minijinja::Error) -> PageError {
        PageError { page, source }
    }
}

/// The pages; `Ok(None)` where the log has no such rollout or path.
pub struct Pages {
    env: Environment<'static>,
}

impl Default for Pages {
    fn default() -> Pages {
        Pages::new()
    }
}

impl Pages {
    pub fn new() -> Pages {
        let mut env = Environment::new();
        for (name, source) in [
            ("base.html", include_str!("templates/base.html")),
            ("runs.html", include_str!("templates/runs.html")),
            ("run.html", include_str!("templates/run.html")),
            (
                "rollout_body.html",
                include_str!("templates/rollout_body.html"),
            ),
            ("rollout.html", include_str!("templates/rollout.html")),
            ("compare.html", include_str!("templates/compare.html")),
            ("path.html", include_str!("templates/path.html")),
            ("missing.html", include_str!("templates/missing.html")),
            ("report.html", include_str!("templates/report.html")),
        ] {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        env.add_global(
            "style",
            minijinja::Value::from_safe_string(STYLE.to_string()),
        );
        Pages { env }
    }

    fn render(&self, page: &'static str, ctx: minijinja::Value) -> Result<String, PageError> {
        self.env
            .get_template(page)
            .and_then(|t| t.render(ctx))
            .map_err(|source| PageError { page, source })
    }

    /// Every run, live: the page updates as events arrive.
    pub fn runs(&self, index: &ViewIndex) -> Result<String, PageError> {
        let runs: Vec<RunLine> = index
            .runs()
            .map(|(id, log)| model::run_line(id, &log.events))
            .collect();
        self.render(
            "runs.html",
            context! { runs, live => "/live", events => index.generation() },
        )
    }

    pub fn run(&self, run: &str, log: &RunLog) -> Result<String, PageError> {
        self.render(
            "run.html",
            context! {
                page => model::run_page(run, &log.events),
                live => live_url(run),
                events => log.events.len(),
            },
        )
    }

    pub fn rollout(
        &self,
        run: &str,
        log: &RunLog,
        rollout: &str,
        text: &dyn TokenText,
    ) -> Result<Option<String>, PageError> {
        let Some(page) = model::rollout_page(run, &log.events, rollout, text) else {
            return Ok(None);
        };
        let ctx = context! { page, live => live_url(run), events => log.events.len() };
        self.render("rollout.html", ctx).map(Some)
    }

    /// Two rollouts side by side (of one group, or one task across harnesses).
    pub fn compare(
        &self,
        run: &str,
        log: &RunLog,
        rollouts: [&str; 2],
        text: &dyn TokenText,
    ) -> Result<Option<String>, PageError> {
        let pages: Option<Vec<_>> = rollouts
            .iter()
            .map(|r| model::rollout_page(run, &log.events, r, text))
            .collect();
        let Some(pages) = pages else {
            return Ok(None);
        };
        let ctx =
            context! { run_id => run, pages, live => live_url(run), events => log.events.len() };
        self.render("compare.html", ctx).map(Some)
    }

    pub fn path(
        &self,
        run: &str,
        log: &RunLog,
        rollout: &str,
        index: usize,
        text: &dyn TokenText,
    ) -> Result<Option<String>, PageError> {
        let Some(page) = model::path_page(run, &log.events, rollout, index, text) else {
            return Ok(None);
        };
        self.render("path.html", context! { page }).map(Some)
    }

    /// `forgelog report --html`: the run's report with plots, one self-contained page.
    pub fn report(
        &self,
        run: &str,
        events: &[forgelog_schemas::Event],
    ) -> Result<String, PageError> {
        crate::report::report_page(&self.env, run, events)
    }

    /// What a link to something the log does not have shows.
    pub fn missing(&self, what: &str) -> Result<String, PageError> {
        self.render("missing.html", context! { what })
    }
}

fn live_url(run: &str) -> String {
    format!("/runs/{}/live", urlencode(run))
}

/// Run ids are the caller's own strings: percent-encode all but the unreserved.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
