use crate::model::{logprob_colour, path_page, rollout_page, run_page};
use crate::testing::recorded_run_with_trees;
use crate::{NoTokenizer, Pages, TokenText, ViewIndex};
use forgelog_schemas::Event;
use serde_json::json;
use std::collections::BTreeMap;

fn run_events(run: &str) -> Vec<Event> {
    recorded_run_with_trees(run, 3, 4, 3, 5)
}

fn batch_rewards(events: &[Event]) -> BTreeMap<String, Option<f64>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::TrainingBatch(b) => Some(b),
            _ => None,
        })
        .flat_map(|b| &b.members)
        .map(|m| (m.rollout_id.clone(), m.reward))
        .collect()
}

#[test]
fn a_run_page_shows_the_clean_rate_of_each_harness_that_followed_up() {
    let events = run_events("r");
    let page = run_page("r", &events);
    let rates = forgelog_consumers_core::clean::clean_rates(&events);
    let with_follow_ups: Vec<(&String, _)> =
        rates.iter().filter(|(_, c)| c.follow_ups > 0).collect();
    assert!(
        !with_follow_ups.is_empty(),
        "the recorded run has follow-up calls"
    );
    assert_eq!(page.clean.len(), with_follow_ups.len());
    for (line, (harness, rate)) in page.clean.iter().zip(with_follow_ups) {
        assert_eq!(
            (&line.harness, line.follow_ups, line.clean),
            (harness, rate.follow_ups, rate.clean)
        );
        let share = 100.0 * rate.clean as f64 / rate.follow_ups as f64;
        assert_eq!(line.rate, format!("{share:.1}%"));
    }
    let mut index = ViewIndex::default();
    for e in events.iter().cloned() {
        index.ingest(e);
    }
    let html = Pages::new().run("r", index.run("r").unwrap()).unwrap();
    assert!(html.contains("id=\"clean\""), "the page has the table");
    assert!(html.contains(&page.clean[0].rate));
}

#[test]
fn a_run_page_shows_every_rollout_once_in_its_group_with_its_batch_reward() {
    let events = run_events("r");
    let page = run_page("r", &events);
    assert_eq!(page.run.rollouts, 12);
    assert_eq!(page.groups.len(), 3);
    let rows: Vec<_> = page.groups.iter().flat_map(|g| &g.rollouts).collect();
    assert_eq!(rows.len(), 12);
    let rewards = batch_rewards(&events);
    assert!(!rewards.is_empty());
    let mut unscored = 0;
    for row in rows {
        let group = page
            .groups
            .iter()
            .find(|g| g.group_id == row.group_id)
            .unwrap();
        assert!(group
            .rollouts
            .iter()
            .any(|r| r.rollout_id == row.rollout_id));
        match rewards.get(&row.rollout_id).copied().flatten() {
            Some(r) => {
                assert_eq!(row.reward, format!("{r:.3}"));
                assert_eq!(row.status, "scored");
            }
            None => {
                unscored += 1;
                assert_eq!(row.reward, "not scored");
                assert!(!row.scored);
                assert_ne!(row.status, "scored", "{row:?}");
            }
        }
        let calls = events
            .iter()
            .filter(|e| matches!(e, Event::CallFinished(c) if c.rollout_id == row.rollout_id))
            .count();
        assert_eq!(row.model_calls as usize, calls, "{row:?}");
    }
    // Every ninth rollout's verifier did not run.
    assert!(unscored >= 1);
}

#[test]
fn a_call_shows_what_is_new_since_its_predecessor_and_its_sampled_tokens() {
    let events = run_events("r");
    let rollout = "r-g0-r1";
    let page = rollout_page("r", &events, rollout, &NoTokenizer).expect("rollout");
    assert!(page.built);
    let calls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) if c.rollout_id == rollout => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(page.calls.len(), calls.len());
    for view in &page.calls {
        let call = calls.iter().find(|c| c.call_index == view.index).unwrap();
        assert_eq!(view.tokens.len(), call.completion_token_ids.len());
        for (t, (&id, lp)) in view.tokens.iter().zip(
            call.completion_token_ids
                .iter()
                .zip(&call.completion_logprobs),
        ) {
            assert_eq!(
                (t.id, t.logprob.as_str()),
                (id, format!("{lp:.4}").as_str())
            );
            assert_eq!(t.text, format!("⟨{id}⟩"));
        }
        assert_eq!(
            view.answer.as_ref().unwrap().text,
            format!("answer {}", view.index)
        );
        if view.index == 0 {
            assert_eq!(view.earlier_messages, 0);
            assert_eq!(view.new_messages.len(), 2);
        } else {
            // The predecessor's messages and answer are carried, not repeated:
            // only the tool result is new.
            assert_eq!(
                view.earlier_messages,
                2 + 2 * view.index as usize - 1,
                "{view:?}"
            );
            assert_eq!(view.new_messages.len(), 1, "{view:?}");
            assert_eq!(view.new_messages[0].role, "tool");
            assert!(!view.rewritten);
        }
    }
}

#[test]
fn a_path_page_colours_exactly_the_sampled_tokens() {
    let events = run_events("r");
    let tree = events
        .iter()
        .find_map(|e| match e {
            Event::TrajectoryBuilt(t) => Some(t),
            _ => None,
        })
        .unwrap();
    let page = path_page("r", &events, &tree.rollout_id, 0, &NoTokenizer).unwrap();
    let s = &tree.sequences[0];
    assert_eq!(page.tokens.len(), s.token_ids.len());
    let sampled: Vec<bool> = page.tokens.iter().map(|t| t.sampled).collect();
    let mask: Vec<bool> = s.loss_mask.iter().map(|&m| m == 1).collect();
    assert_eq!(sampled, mask);
    assert!(page.tokens.iter().all(|t| t.sampled != t.colour.is_empty()));
    assert!(path_page("r", &events, &tree.rollout_id, 999, &NoTokenizer).is_none());
    assert!(rollout_page("r", &events, "no-such-rollout", &NoTokenizer).is_none());
}

#[test]
fn likely_tokens_are_green_and_unlikely_ones_red() {
    assert_eq!(logprob_colour(0.0), "hsl(120,75%,82%)");
    assert_eq!(logprob_colour(-30.0), "hsl(0,75%,82%)");
    assert_eq!(logprob_colour(0.5_f32.ln()), "hsl(60,75%,82%)");
}

struct Upper;
impl TokenText for Upper {
    fn token_text(&self, id: u32) -> Option<String> {
        Some(format!("<b>\"{id}"))
    }
}

#[test]
fn every_page_renders_and_what_the_log_holds_is_escaped() {
    let mut events = run_events("r&<x>");
    // What a harness or a model wrote is text, never markup.
    for e in events.iter_mut() {
        if let Event::CallFinished(c) = e {
            c.chat_request = json!({"messages": [
                {"role": "user", "content": "<script>alert(1)</script>"}
            ]})
            .to_string();
        }
    }
    let mut index = ViewIndex::default();
    for e in events {
        index.ingest(e);
    }
    let pages = Pages::new();
    let runs = pages.runs(&index).unwrap();
    assert!(runs.contains("/runs/r%26%3Cx%3E"), "{runs}");
    assert!(!runs.contains("<x>"));
    let log = index.run("r&<x>").unwrap();
    let run = pages.run("r&<x>", log).unwrap();
    assert_eq!(run.matches("class=\"rollout\"").count(), 12);
    let rollout = pages
        .rollout("r&<x>", log, "r&<x>-g0-r0", &Upper)
        .unwrap()
        .unwrap();
    assert!(
        rollout.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
        "{rollout}"
    );
    assert!(!rollout.contains("<script>alert"));
    assert!(!rollout.contains("<b>"));
    // A token's text in its hover title stays inside the attribute.
    assert!(rollout.contains("title=\"id "), "{rollout}");
    assert!(rollout.contains("&quot;&lt;b&gt;\\&quot;"), "{rollout}");
    let both = pages
        .compare("r&<x>", log, ["r&<x>-g0-r0", "r&<x>-g1-r2"], &Upper)
        .unwrap()
        .unwrap();
    assert_eq!(both.matches("class=\"rollout-body\"").count(), 2);
    assert!(pages
        .compare("r&<x>", log, ["r&<x>-g0-r0", "nope"], &Upper)
        .unwrap()
        .is_none());
    assert!(pages
        .path("r&<x>", log, "r&<x>-g0-r0", 0, &Upper)
        .unwrap()
        .is_some());
    assert!(pages.missing("<nope>").unwrap().contains("&lt;nope&gt;"));
}

#[test]
fn the_index_keeps_runs_apart_and_drops_the_bytes_no_page_shows() {
    let mut index = ViewIndex::default();
    let (a, b) = (run_events("a"), run_events("b"));
    let calls = a
        .iter()
        .filter(|e| matches!(e, Event::CallFinished(_)))
        .count();
    for e in a.iter().chain(&b).cloned() {
        index.ingest(e);
    }
    assert_eq!(
        index.runs().map(|(id, _)| id).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let log = index.run("a").unwrap();
    assert_eq!(
        log.events
            .iter()
            .filter(|e| matches!(e, Event::CallFinished(_)))
            .count(),
        calls
    );
    assert!(log.events.iter().all(|e| match e {
        Event::CallFinished(c) => c.response_body.is_empty(),
        Event::TrainingBatch(t) => t.members.iter().all(|m| m.sequences.is_empty()),
        Event::CallStarted(_) => false,
        _ => true,
    }));
    assert_eq!(index.run_events("a"), log.events.len());
    assert_eq!(
        index.generation() as usize,
        index.run_events("a") + index.run_events("b")
    );
}

/// A published version's step as the trainer writes it.
fn published(run: &str, version: i64) -> Event {
    let metrics = [
        ("loss", 0.5 / version as f64),
        ("is_ratio_mean", 1.0),
        ("is_ratio_min", 0.8),
        ("is_ratio_max", 1.0 + 0.1 * version as f64),
        ("staleness_mean", 0.5),
        ("staleness_max", 1.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    forgelog_schemas::PolicyPublished {
        run_id: run.into(),
        event_id: format!("p{version}"),
        version,
        step: version,
        checkpoint_uri: format!("file:///c/v{version}"),
        metrics,
    }
    .into()
}

#[test]
fn the_report_page_has_its_tables_and_a_plot_per_measure() {
    let mut events = run_events("r");
    let pages = Pages::new();
    // Before training: reward and pass rate per version, nothing of the trainer.
    let before = pages.report("r", &events).unwrap();
    assert_eq!(before.matches("<svg").count(), 3, "{before}");
    assert!(before.contains("Sampled tokens per second per policy version"));
    assert!(
        before.contains("<th>tokens/s</th>"),
        "the throughput column"
    );
    assert!(before.contains("Mean reward per policy version"));
    assert!(!before.contains("Importance ratio"));
    events.extend((1..=3).map(|v| published("r", v)));
    let after = pages.report("r", &events).unwrap();
    for title in [
        "Mean reward per policy version",
        "Pass rate per policy version",
        "Sampled tokens per second per policy version",
        "Importance ratio per published version",
        "Staleness per published version",
        "Loss per published version",
    ] {
        assert!(
            after.contains(&format!("data-title=\"{title}\"")),
            "no {title}"
        );
    }
    assert_eq!(after.matches("<svg").count(), 6);
    // Self-contained: the stylesheet inline, nothing fetched.
    assert!(
        !after.contains("/static/") && !after.contains("<script"),
        "{after}"
    );
    assert!(after.contains("<td>v3</td>"), "the published table");
    // A line per series: three IS ratio lines.
    let is_plot = after.split("data-title=\"Importance ratio").nth(1).unwrap();
    let is_plot = &is_plot[..is_plot.find("</figure>").unwrap()];
    assert!(is_plot.contains("is_ratio_max") && is_plot.contains("is_ratio_min"));
}
