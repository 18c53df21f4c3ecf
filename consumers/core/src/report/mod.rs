//! `forgelog report`: what happened in a run, per policy version, read from
//! the log alone. A rollout belongs to the version that served its first
//! call (what the engine stamped on it), or the one its session started
//! under when it made none. Pure: events in, tables out.

use crate::clean::{clean_rates, CleanRate};
use forgelog_schemas::Event;
use std::collections::BTreeMap;
use std::fmt;

/// One (version, harness) row.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct VersionRow {
    /// `None`: the engine reported no version.
    pub version: Option<i64>,
    pub harness: String,
    pub rollouts: usize,
    pub scored: usize,
    /// Scored with a reward of at least 1.
    pub passed: usize,
    pub reward_sum: f64,
    /// Null rewards (the verifier did not score), counted apart.
    pub unscored: usize,
    pub model_calls: i64,
    /// Calls the log holds by a stand-in ([`forgelog_schemas::CallFinished::stand_in`]):
    /// their events were refused, their tokens are context.
    pub stand_ins: i64,
    pub tool_calls: i64,
    pub sampled_tokens: i64,
    /// When its first call started and its last one ended, as the proxy
    /// recorded them (ms since the epoch): the span its tokens were sampled in.
    pub first_call_ms: Option<i64>,
    pub last_call_ms: Option<i64>,
}

impl VersionRow {
    pub fn mean_reward(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.reward_sum / self.scored as f64)
    }

    /// Tokens sampled per second of the span its calls ran in (wall time, all
    /// of them in parallel), from the recorded call times: no clock read here.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let span = self.last_call_ms? - self.first_call_ms?;
        (span > 0).then(|| self.sampled_tokens as f64 * 1000.0 / span as f64)
    }
}

/// A published version and the training step that made it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Published {
    pub version: i64,
    pub step: i64,
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    pub rows: Vec<VersionRow>,
    pub published: Vec<Published>,
    /// Per harness: follow-up calls, and those whose prompt held the earlier
    /// call's sampled ids exactly ([`crate::clean`]).
    pub clean: BTreeMap<String, CleanRate>,
    /// The groups built for training, and those among them whose members
    /// all scored alike: no advantage, nothing for the learner to learn.
    pub groups: usize,
    pub groups_without_variance: usize,
}

#[derive(Default)]
struct Rollout {
    harness: String,
    started_version: Option<i64>,
    first_call_version: Option<(i64, Option<i64>)>,
    reward: Option<Option<f64>>,
    model_calls: i64,
    stand_ins: i64,
    tool_calls: i64,
    sampled: i64,
    /// Its calls' earliest start and latest end (ms).
    calls_span: Option<(i64, i64)>,
    abandoned: bool,
}

/// The smallest span holding `a` and `b`.
fn widen(a: Option<(i64, i64)>, b: Option<(i64, i64)>) -> Option<(i64, i64)> {
    match (a, b) {
        (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
        (a, b) => a.or(b),
    }
}

impl Report {
    /// The report of one run's events (any order; other runs' events are
    /// the caller's to leave out).
    pub fn of(events: &[Event]) -> Report {
        let mut rollouts: BTreeMap<&str, Rollout> = BTreeMap::new();
        let mut published = BTreeMap::new();
        let mut groups: BTreeMap<&str, bool> = BTreeMap::new();
        for e in events {
            match e {
                Event::RolloutStarted(s) => {
                    let r = rollouts.entry(&s.rollout_id).or_default();
                    r.harness = s.harness.clone();
                    r.started_version = s.policy_version;
                }
                Event::CallFinished(c) => {
                    let r = rollouts.entry(&c.rollout_id).or_default();
                    r.model_calls += 1;
                    r.stand_ins += i64::from(c.stand_in.is_some());
                    r.sampled += c.completion_token_ids.len() as i64;
                    let ran = (c.finished_at_ms - c.latency_ms, c.finished_at_ms);
                    r.calls_span = widen(r.calls_span, Some(ran));
                    if r.first_call_version.is_none_or(|(i, _)| c.call_index < i) {
                        r.first_call_version = Some((c.call_index, c.policy_version));
                    }
                }
                Event::TrajectoryBuilt(t) => {
                    rollouts.entry(&t.rollout_id).or_default().tool_calls = t.tool_calls;
                }
                Event::VerifierResult(v) => {
                    let r = rollouts.entry(&v.rollout_id).or_default();
                    r.reward = Some(v.reward.filter(|_| v.ok));
                    r.abandoned = v.abandoned;
                }
                Event::TrainingBatch(b) => {
                    groups.insert(&b.group_id, b.no_reward_variance);
                }
                Event::PolicyPublished(p) => {
                    published.insert(
                        p.version,
                        Published {
                            version: p.version,
                            step: p.step,
                            metrics: p.metrics.clone(),
                        },
                    );
                }
                _ => {}
            }
        }
        let mut rows: BTreeMap<(Option<i64>, String), VersionRow> = BTreeMap::new();
        // Abandoned attempts ran again under another id; unfinished ones have no verdict yet.
        for r in rollouts
            .values()
            .filter(|r| !r.abandoned && r.reward.is_some())
        {
            let version = match r.first_call_version {
                Some((_, v)) => v,
                None => r.started_version,
            };
            let row = rows
                .entry((version, r.harness.clone()))
                .or_insert_with(|| VersionRow {
                    version,
                    harness: r.harness.clone(),
                    ..Default::default()
                });
            row.rollouts += 1;
            row.model_calls += r.model_calls;
            row.stand_ins += r.stand_ins;
            row.tool_calls += r.tool_calls;
            row.sampled_tokens += r.sampled;
            let span = widen(row.first_call_ms.zip(row.last_call_ms), r.calls_span);
            (row.first_call_ms, row.last_call_ms) = span.unzip();
            match r.reward.flatten() {
                Some(x) => {
                    row.scored += 1;
                    row.reward_sum += x;
                    row.passed += usize::from(x >= 1.0);
                }
                None => row.unscored += 1,
            }
        }
        Report {
            rows: rows.into_values().collect(),
            published: published.into_values().collect(),
            clean: clean_rates(events),
            groups: groups.len(),
            groups_without_variance: groups.values().filter(|&&flat| flat).count(),
        }
    }

    /// Mean reward over the scored rollouts of the first and the last `n`
    /// versions that served rollouts.
    pub fn first_and_last(&self, n: usize) -> Option<(f64, f64)> {
        let mut by_version: BTreeMap<i64, (f64, usize)> = BTreeMap::new();
        for r in &self.rows {
            if let Some(v) = r.version {
                let e = by_version.entry(v).or_default();
                e.0 += r.reward_sum;
                e.1 += r.scored;
            }
        }
        let versions: Vec<(f64, usize)> = by_version.into_values().collect();
        let mean = |xs: &[(f64, usize)]| {
            let (sum, count) = xs.iter().fold((0.0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
            (count > 0).then(|| sum / count as f64)
        };
        let n = n.min(versions.len());
        Some((
            mean(&versions[..n])?,
            mean(&versions[versions.len() - n..])?,
        ))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
        let per = |x: i64, n: usize| format!("{:.1}", x as f64 / n.max(1) as f64);
        writeln!(
            f,
            "{:>7} {:<16} {:>8} {:>6} {:>6} {:>7} {:>8} {:>7} {:>7} {:>9} {:>7}",
            "version",
            "harness",
            "rollouts",
            "scored",
            "pass",
            "reward",
            "unscored",
            "calls",
            "tools",
            "tokens",
            "tok/s"
        )?;
        for r in &self.rows {
            let pass = (r.scored > 0).then(|| r.passed as f64 / r.scored as f64);
            writeln!(
                f,
                "{:>7} {:<16} {:>8} {:>6} {:>6} {:>7} {:>8} {:>7} {:>7} {:>9} {:>7}",
                r.version.map_or("?".into(), |v| v.to_string()),
                r.harness,
                r.rollouts,
                r.scored,
                pass.map_or("-".into(), |p| format!("{:.0}%", p * 100.0)),
                num(r.mean_reward()),
                r.unscored,
                per(r.model_calls, r.rollouts),
                per(r.tool_calls, r.rollouts),
                r.sampled_tokens,
                r.tokens_per_second()
                    .map_or("-".into(), |t| format!("{t:.1}"))
            )?;
        }
        for (harness, c) in self.clean.iter().filter(|(_, c)| c.follow_ups > 0) {
            writeln!(
                f,
                "CLEAN {harness}: {} of {} follow-up calls hold the earlier call's sampled ids ({})",
                c.clean,
                c.follow_ups,
                c.rate().map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
            )?;
        }
        let stand_ins: i64 = self.rows.iter().map(|r| r.stand_ins).sum();
        if stand_ins > 0 {
            writeln!(
                f,
                "STAND-INS: {stand_ins} calls' events were refused by the log; each is held by its tokens, as context (`forgelog spool status` lists the originals)"
            )?;
        }
        if self.groups > 0 {
            writeln!(
                f,
                "GROUPS: {} built for training, {} without reward variance (every member scored alike: nothing to learn)",
                self.groups, self.groups_without_variance
            )?;
        }
        if self.published.is_empty() {
            return writeln!(f, "\nno policy published in this run");
        }
        // A step whose groups all lacked variance trained no token: its
        // version holds the weights of the one before.
        writeln!(
            f,
            "\n{:>7} {:>5} {:>7} {:>9} {:>9} {:>20} {:>6} {:>9}",
            "version",
            "step",
            "tokens",
            "loss",
            "grad",
            "IS ratio mean/min/max",
            "trunc",
            "staleness"
        )?;
        for p in &self.published {
            let m = |k: &str| p.metrics.get(k).copied();
            writeln!(
                f,
                "{:>7} {:>5} {:>7} {:>9} {:>9} {:>20} {:>6} {:>9}",
                p.version,
                p.step,
                m("tokens").map_or("-".into(), |t| format!("{t:.0}")),
                num(m("loss")),
                num(m("grad_norm")),
                format!(
                    "{}/{}/{}",
                    num(m("is_ratio_mean")),
                    num(m("is_ratio_min")),
                    num(m("is_ratio_max"))
                ),
                num(m("truncated_fraction")),
                num(m("staleness_mean"))
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
