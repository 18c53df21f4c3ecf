//! `forgelog run --replay R`: which attempts of a recorded run are re-run,
//! the clock each one starts at, and how a re-run ended against its
//! recording. Pure: fed the run's `RolloutStarted`, `RolloutFinished` and
//! `VerifierResult` events in any order.

use crate::plan::{attempt_of, Group, Rollout, RunPlan};
use crate::summary::Outcome;
use forgelog_schemas::Event;
use std::collections::BTreeMap;
use std::fmt;

/// How an attempt ended: as the log recorded it, or as its re-run did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptEnd {
    /// The harness's exit status (`None`: it did not exit: timed out, failed to start).
    pub exit_status: Option<i64>,
    pub model_calls: i64,
    /// The verifier's reward; `None` when it did not score.
    pub reward: Option<f64>,
}

impl AttemptEnd {
    /// What differs from `recorded`, in words (empty: nothing).
    pub fn differences(&self, recorded: &AttemptEnd) -> Vec<String> {
        let show = |x: Option<String>| x.unwrap_or_else(|| "none".into());
        let mut out = Vec::new();
        if self.exit_status != recorded.exit_status {
            out.push(format!(
                "exit status {} → {}",
                show(recorded.exit_status.map(|c| c.to_string())),
                show(self.exit_status.map(|c| c.to_string()))
            ));
        }
        if self.model_calls != recorded.model_calls {
            out.push(format!(
                "model calls {} → {}",
                recorded.model_calls, self.model_calls
            ));
        }
        if self.reward != recorded.reward {
            out.push(format!(
                "reward {} → {}",
                show(recorded.reward.map(|r| r.to_string())),
                show(self.reward.map(|r| r.to_string()))
            ));
        }
        out
    }
}

/// One recorded attempt to re-run.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedAttempt {
    /// The rollout as the replay plan runs it: its id is the recorded
    /// attempt's, so the re-run's session is that attempt's.
    pub rollout: Rollout,
    /// When its session was opened: the clock its re-run starts at.
    pub started_at_ms: i64,
    pub end: AttemptEnd,
}

/// libfaketime's `FAKETIME` for a clock that reads `start_ms` at `now_ms`
/// and runs on from there: an offset from the real clock, the same in every
/// process of the attempt whenever it starts (an absolute `@` start would
/// restart the clock in each new process, and programs that compare times
/// across processes go wrong).
pub fn faketime_offset(start_ms: i64, now_ms: i64) -> String {
    let secs = (start_ms - now_ms).div_euclid(1000);
    format!("{secs:+}s")
}

/// A recorded run as `run --replay` re-runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRun {
    /// The groups and the attempts to re-run, in plan order.
    pub plan: RunPlan,
    pub attempts: Vec<RecordedAttempt>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayPlanError {
    #[error("run {0} has no finished rollouts in the log")]
    Empty(String),
    #[error("{wanted} is not a finished rollout of run {run} (it has {known})")]
    Unknown {
        wanted: String,
        run: String,
        known: String,
    },
}

#[derive(Default)]
struct Seen {
    started: Option<forgelog_schemas::RolloutStarted>,
    finished: Option<forgelog_schemas::RolloutFinished>,
    abandoned: bool,
    reward: Option<f64>,
}

impl RecordedRun {
    /// The attempt of each rollout of `run` that stands (finished, not
    /// abandoned; the last such when there are several), restricted to
    /// `only` (rollout or attempt ids) unless it is empty.
    pub fn from_events<'a>(
        run: &str,
        events: impl IntoIterator<Item = &'a Event>,
        only: &[String],
    ) -> Result<RecordedRun, ReplayPlanError> {
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        for e in events {
            match e {
                Event::RolloutStarted(s) if s.run_id == run => {
                    seen.entry(s.rollout_id.clone()).or_default().started = Some(s.clone());
                }
                Event::RolloutFinished(f) if f.run_id == run => {
                    seen.entry(f.rollout_id.clone()).or_default().finished = Some(f.clone());
                }
                Event::VerifierResult(v) if v.run_id == run => {
                    let s = seen.entry(v.rollout_id.clone()).or_default();
                    s.abandoned |= v.abandoned;
                    s.reward = v.reward.filter(|_| v.ok);
                }
                _ => {}
            }
        }
        // The standing attempt per rollout: attempt numbers ascend, the last wins.
        let mut standing: BTreeMap<String, (u32, RecordedAttempt)> = BTreeMap::new();
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        for (id, s) in &seen {
            let (Some(started), Some(finished)) = (&s.started, &s.finished) else {
                continue;
            };
            if s.abandoned {
                continue;
            }
            let (rollout, n) = attempt_of(id);
            if standing.get(rollout).is_some_and(|(m, _)| *m > n) {
                continue;
            }
            let member = rollout
                .rsplit_once('-')
                .and_then(|(_, m)| m.parse().ok())
                .unwrap_or(0);
            groups
                .entry(started.group_id.clone())
                .or_insert_with(|| Group {
                    id: started.group_id.clone(),
                    task: started.task_id.clone(),
                    harness: started.harness.clone(),
                    size: started.group_size.max(1) as usize,
                });
            let attempt = RecordedAttempt {
                rollout: Rollout {
                    id: id.clone(),
                    group: started.group_id.clone(),
                    task: started.task_id.clone(),
                    harness: started.harness.clone(),
                    member,
                },
                started_at_ms: started.started_at_ms,
                end: AttemptEnd {
                    exit_status: finished.exit_status,
                    model_calls: finished.model_calls,
                    reward: s.reward,
                },
            };
            standing.insert(rollout.to_string(), (n, attempt));
        }
        if standing.is_empty() {
            return Err(ReplayPlanError::Empty(run.to_string()));
        }
        for wanted in only {
            let known = standing
                .iter()
                .any(|(rollout, (_, a))| rollout == wanted || &a.rollout.id == wanted);
            if !known {
                return Err(ReplayPlanError::Unknown {
                    wanted: wanted.clone(),
                    run: run.to_string(),
                    known: standing.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        let mut attempts: Vec<RecordedAttempt> = standing
            .into_iter()
            .filter(|(rollout, (_, a))| {
                only.is_empty() || only.iter().any(|w| w == rollout || *w == a.rollout.id)
            })
            .map(|(_, (_, a))| a)
            .collect();
        attempts.sort_by(|a, b| {
            (&a.rollout.group, a.rollout.member, &a.rollout.id).cmp(&(
                &b.rollout.group,
                b.rollout.member,
                &b.rollout.id,
            ))
        });
        groups.retain(|id, _| attempts.iter().any(|a| &a.rollout.group == id));
        let plan = RunPlan {
            run_id: run.to_string(),
            groups: groups.into_values().collect(),
            rollouts: attempts.iter().map(|a| a.rollout.clone()).collect(),
        };
        Ok(RecordedRun { plan, attempts })
    }

    /// Each attempt's recording beside how its re-run ended (`outcomes` of
    /// the replay plan; an attempt with no outcome did not run).
    pub fn compare(&self, outcomes: &[Outcome]) -> Vec<ReplayedAttempt> {
        self.attempts
            .iter()
            .map(|a| ReplayedAttempt {
                attempt: a.rollout.id.clone(),
                harness: a.rollout.harness.clone(),
                recorded: a.end.clone(),
                replayed: outcomes
                    .iter()
                    .find(|o| o.rollout_id == a.rollout.id && o.status.is_some())
                    .map(|o| AttemptEnd {
                        exit_status: o.exit_status,
                        model_calls: o.model_calls,
                        reward: o.reward,
                    }),
            })
            .collect()
    }
}

/// A recorded attempt and its re-run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayedAttempt {
    pub attempt: String,
    pub harness: String,
    pub recorded: AttemptEnd,
    /// `None`: it was not re-run.
    pub replayed: Option<AttemptEnd>,
}

impl ReplayedAttempt {
    /// How the re-run ended differently (empty: the same).
    pub fn differences(&self) -> Vec<String> {
        match &self.replayed {
            Some(end) => end.differences(&self.recorded),
            None => vec!["not re-run".into()],
        }
    }
}

/// The table `run --replay` ends with: one row per attempt.
pub struct ReplayTable<'a>(pub &'a [ReplayedAttempt]);

impl fmt::Display for ReplayTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = |e: Option<&AttemptEnd>| match e {
            None => "-".to_string(),
            Some(e) => format!(
                "exit {} calls {} reward {}",
                e.exit_status.map_or("-".into(), |c| c.to_string()),
                e.model_calls,
                e.reward.map_or("-".into(), |r| format!("{r}"))
            ),
        };
        writeln!(
            f,
            "{:<40} {:<15} {:<30} {:<30} same",
            "attempt", "harness", "recorded", "replayed"
        )?;
        for a in self.0 {
            let differences = a.differences();
            writeln!(
                f,
                "{:<40} {:<15} {:<30} {:<30} {}",
                a.attempt,
                a.harness,
                end(Some(&a.recorded)),
                end(a.replayed.as_ref()),
                if differences.is_empty() {
                    "yes".to_string()
                } else {
                    format!("NO: {}", differences.join(", "))
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::{RolloutFinished, RolloutStarted, VerifierResult};

    fn started(id: &str, group: &str, at: i64) -> Event {
        Event::RolloutStarted(RolloutStarted {
            run_id: "r".into(),
            event_id: format!("s-{id}"),
            rollout_id: id.into(),
            session_id: format!("sess-{id}"),
            task_id: "hello".into(),
            harness: "codex".into(),
            group_id: group.into(),
            group_size: 2,
            policy_version: Some(0),
            started_at_ms: at,
            max_model_calls: Some(6),
            max_tokens: None,
            api_key_sha256: None,
        })
    }

    fn finished(id: &str, exit: Option<i64>, calls: i64) -> Event {
        Event::RolloutFinished(RolloutFinished {
            run_id: "r".into(),
            event_id: format!("f-{id}"),
            rollout_id: id.into(),
            session_id: format!("sess-{id}"),
            exit_status: exit,
            model_calls: calls,
            started_at_ms: 0,
            finished_at_ms: 1,
        })
    }

    fn verdict(id: &str, reward: Option<f64>, abandoned: bool) -> Event {
        Event::VerifierResult(VerifierResult {
            run_id: "r".into(),
            event_id: format!("v-{id}"),
            rollout_id: id.into(),
            ok: reward.is_some(),
            reward,
            details: String::new(),
            abandoned,
        })
    }

    fn run() -> Vec<Event> {
        vec![
            // Member 1 first: plan order is the group's member order.
            started("g-1", "g", 20),
            finished("g-1", Some(0), 4),
            verdict("g-1", Some(0.0), false),
            // Member 0's first try never reached the model: abandoned; its
            // second try stands.
            started("g-0", "g", 10),
            finished("g-0", None, 0),
            verdict("g-0", None, true),
            started("g-0~1", "g", 15),
            finished("g-0~1", Some(0), 6),
            verdict("g-0~1", Some(1.0), false),
            // Never finished: not replayed.
            started("h-0", "h", 30),
        ]
    }

    #[test]
    fn the_standing_attempt_of_each_finished_rollout_is_replayed_at_its_start() {
        let rec = RecordedRun::from_events("r", &run(), &[]).unwrap();
        let ids: Vec<&str> = rec.plan.rollouts.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["g-0~1", "g-1"]);
        assert_eq!(rec.plan.groups.len(), 1, "group h has nothing to replay");
        assert_eq!(rec.attempts[0].started_at_ms, 15);
        assert_eq!(
            rec.attempts[0].end,
            AttemptEnd {
                exit_status: Some(0),
                model_calls: 6,
                reward: Some(1.0)
            }
        );
        // The re-run's session is the recorded attempt's.
        assert_eq!(rec.plan.rollouts[0].attempt_id(0), "g-0~1");
    }

    #[test]
    fn only_names_rollouts_or_attempts_and_an_unknown_one_is_an_error() {
        let by_rollout = RecordedRun::from_events("r", &run(), &["g-0".into()]).unwrap();
        let by_attempt = RecordedRun::from_events("r", &run(), &["g-0~1".into()]).unwrap();
        assert_eq!(by_rollout, by_attempt);
        assert_eq!(by_rollout.attempts.len(), 1);
        let err = RecordedRun::from_events("r", &run(), &["h-0".into()]).unwrap_err();
        assert!(err.to_string().contains("it has g-0, g-1"), "{err}");
        assert_eq!(
            RecordedRun::from_events("other", &run(), &[]),
            Err(ReplayPlanError::Empty("other".into()))
        );
    }

    #[test]
    fn the_pinned_clock_is_an_offset_to_the_recorded_start() {
        assert_eq!(faketime_offset(1_000_000, 1_061_500), "-62s");
        assert_eq!(faketime_offset(5_000, 5_000), "+0s");
        assert_eq!(faketime_offset(10_000, 4_000), "+6s");
    }

    #[test]
    fn a_rerun_is_compared_field_by_field() {
        let rec = RecordedRun::from_events("r", &run(), &[]).unwrap();
        let outcome = |id: &str, exit, calls, reward| Outcome {
            rollout_id: id.into(),
            harness: "codex".into(),
            attempt: id.into(),
            status: Some(crate::RolloutStatus::Scored),
            exit_status: exit,
            reward,
            model_calls: calls,
            sampled_tokens: 0,
            retries: 0,
            unrouted: Vec::new(),
        };
        let rows = rec.compare(&[
            outcome("g-0~1", Some(0), 6, Some(1.0)),
            outcome("g-1", Some(1), 3, Some(0.0)),
        ]);
        assert!(rows[0].differences().is_empty(), "{:?}", rows[0]);
        assert_eq!(
            rows[1].differences(),
            ["exit status 0 → 1", "model calls 4 → 3"]
        );
        assert_eq!(rec.compare(&[])[0].differences(), ["not re-run"]);
        let table = ReplayTable(&rows).to_string();
        assert!(table.contains("NO: exit status 0 → 1"), "{table}");
        assert!(table.lines().nth(1).unwrap().ends_with("yes"), "{table}");
    }
}
