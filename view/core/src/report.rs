//! `forgelog report --html`: a run's report as one self-contained page: the
//! tables per policy version and harness, and plots of how the run went
//! (drawn by plotters into inline SVG; nothing fetched, no script).

use crate::model::{self, PublishedLine, VersionLine};
use crate::pages::PageError;
use forgelog_consumers_core::report::Report;
use forgelog_schemas::Event;
use minijinja::context;
use plotters::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// A line of points, named for its legend.
type Series = (String, Vec<(f64, f64)>);

#[derive(Debug, Serialize)]
struct Plot {
    title: &'static str,
    svg: String,
}

/// Reward, pass rate and sampling throughput per version per harness; the
/// trainer's IS ratio, staleness and loss per published version.
fn plots(report: &Report) -> Vec<Plot> {
    let by_harness =
        |value: &dyn Fn(&forgelog_consumers_core::report::VersionRow) -> Option<f64>| {
            let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for row in &report.rows {
                if let (Some(v), Some(y)) = (row.version, value(row)) {
                    series
                        .entry(row.harness.clone())
                        .or_default()
                        .push((v as f64, y));
                }
            }
            series.into_iter().collect::<Vec<Series>>()
        };
    let reward = by_harness(&|r| r.mean_reward());
    let pass_rate = by_harness(&|r| (r.scored > 0).then(|| r.passed as f64 / r.scored as f64));
    let throughput = by_harness(&|r| r.tokens_per_second());
    let published = |keys: &[&str]| -> Vec<Series> {
        keys.iter()
            .map(|k| {
                let points = report
                    .published
                    .iter()
                    .filter_map(|p| p.metrics.get(*k).map(|y| (p.version as f64, *y)))
                    .collect();
                (k.to_string(), points)
            })
            .filter(|(_, points): &Series| !points.is_empty())
            .collect()
    };
    [
        (
            "Mean reward per policy version",
            "version",
            "reward",
            reward,
        ),
        (
            "Pass rate per policy version",
            "version",
            "passed / scored",
            pass_rate,
        ),
        (
            "Sampled tokens per second per policy version",
            "version",
            "tokens / s (wall)",
            throughput,
        ),
        (
            "Importance ratio per published version",
            "version",
            "π_new / π_old",
            published(&["is_ratio_mean", "is_ratio_min", "is_ratio_max"]),
        ),
        (
            "Staleness per published version",
            "version",
            "versions behind",
            published(&["staleness_mean", "staleness_max"]),
        ),
        (
            "Loss per published version",
            "version",
            "loss",
            published(&["loss"]),
        ),
    ]
    .into_iter()
    .filter_map(|(title, x, y, series)| {
        line_chart(title, x, y, &series).map(|svg| Plot { title, svg })
    })
    .collect()
}

/// The smallest and largest of `values`, widened when they are equal.
fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return None;
    }
    let pad = ((hi - lo) * 0.05).max(0.5);
    Some((lo - pad, hi + pad))
}

/// One line per series with a legend, as an SVG document; `None` without points.
fn line_chart(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Option<String> {
    let points = || series.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) = span(points().map(|p| p.0))?;
    let (y0, y1) = span(points().map(|p| p.1))?;
    let mut svg = String::new();
    let drawn: Result<(), Box<dyn std::error::Error>> = (|| {
        let root = SVGBackend::with_string(&mut svg, (720, 320)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        // Versions are whole numbers: a label per version, up to a dozen.
        let versions = ((x1 - x0).floor() as usize + 1).clamp(2, 12);
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(versions)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{:.2}", if y.abs() < 1e-9 { 0.0 } else { *y }))
            .draw()?;
        for (i, (name, line)) in series.iter().enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour));
            chart.draw_series(PointSeries::of_element(
                line.iter().copied(),
                3,
                colour.filled(),
                &|c, s, st| Circle::new(c, s, st),
            ))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    drawn.ok().map(|_| svg)
}

/// The page: the report's tables and its plots.
pub fn report_page(
    env: &minijinja::Environment<'static>,
    run_id: &str,
    events: &[Event],
) -> Result<String, PageError> {
    let page = model::run_page(run_id, events);
    let report = Report::of(events);
    let versions: Vec<VersionLine> = page.versions;
    let published: Vec<PublishedLine> = page.published;
    let first_and_last = report
        .first_and_last(5)
        .map(|(a, b)| format!("reward first 5 versions: {a:.3}, last 5 versions: {b:.3}"));
    env.get_template("report.html")
        .and_then(|t| {
            t.render(context! {
                run => page.run,
                versions,
                published,
                plots => plots(&report),
                first_and_last,
            })
        })
        .map_err(|source| PageError::new("report.html", source))
}
