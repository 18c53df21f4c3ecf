//! The runs page's lines and a run's page.

use super::*;

/// One line of the runs page.
#[derive(Debug, Clone, Serialize)]
pub struct RunLine {
    pub run_id: String,
    pub rollouts: usize,
    pub groups: usize,
    pub harnesses: Vec<String>,
    pub model_calls: usize,
    pub versions_published: usize,
    pub mean_reward: String,
}

/// One rollout as a row of its run's page.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RolloutRow {
    pub rollout_id: String,
    pub session_id: String,
    pub harness: String,
    pub task_id: String,
    pub group_id: String,
    /// The reward, or "not scored".
    pub reward: String,
    pub scored: bool,
    /// Where the rollout is: "scored", "running", "verifier pending", or why it has no reward.
    pub status: String,
    pub advantage: String,
    /// The policy version that served its first call (else the one it started under).
    pub version: String,
    pub model_calls: i64,
    pub tool_calls: i64,
    pub duration: String,
    pub exit_status: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupView {
    pub group_id: String,
    pub task_id: String,
    /// The group's batch said its rewards do not vary (no learning signal).
    pub no_reward_variance: bool,
    pub rollouts: Vec<RolloutRow>,
}

/// One (version, harness) line of the run's report.
#[derive(Debug, Clone, Serialize)]
pub struct VersionLine {
    pub version: String,
    pub harness: String,
    pub rollouts: usize,
    pub scored: usize,
    pub passed: usize,
    pub unscored: usize,
    pub mean_reward: String,
    pub model_calls: i64,
    pub tool_calls: i64,
    pub sampled_tokens: i64,
    /// Sampled tokens per second of the span the calls ran in.
    pub tokens_per_second: String,
}

/// Token in, per harness: of the follow-up calls, those whose prompt holds
/// the earlier call's sampled ids exactly (the rest drifted).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CleanLine {
    pub harness: String,
    pub follow_ups: usize,
    pub clean: usize,
    /// The share, as a percentage.
    pub rate: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishedLine {
    pub version: i64,
    pub step: i64,
    pub metrics: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunPage {
    pub run: RunLine,
    pub versions: Vec<VersionLine>,
    pub published: Vec<PublishedLine>,
    /// Harnesses with follow-up calls only.
    pub clean: Vec<CleanLine>,
    pub groups: Vec<GroupView>,
    /// What the compare form offers first: the first group's first two rollouts.
    pub default_a: String,
    pub default_b: String,
}

/// The runs page line of one run.
pub fn run_line(run_id: &str, events: &[Event]) -> RunLine {
    let r = Rollouts::of(events);
    let rows: Vec<RolloutRow> = r.order.iter().map(|id| r.row(id)).collect();
    let groups: BTreeSet<&str> = rows.iter().map(|x| x.group_id.as_str()).collect();
    let harnesses: BTreeSet<&str> = rows.iter().map(|x| x.harness.as_str()).collect();
    RunLine {
        run_id: run_id.to_string(),
        rollouts: rows.len(),
        groups: groups.len(),
        harnesses: harnesses.into_iter().map(String::from).collect(),
        model_calls: r.calls.values().sum(),
        versions_published: r.published,
        mean_reward: mean(rows.iter().filter_map(|x| x.reward.parse().ok())),
    }
}

/// A run's page: its report per version, then its groups and their rollouts.
pub fn run_page(run_id: &str, events: &[Event]) -> RunPage {
    let r = Rollouts::of(events);
    let mut groups: Vec<GroupView> = Vec::new();
    let mut group_at: BTreeMap<String, usize> = BTreeMap::new();
    for id in &r.order {
        let row = r.row(id);
        let at = *group_at.entry(row.group_id.clone()).or_insert_with(|| {
            groups.push(GroupView {
                group_id: row.group_id.clone(),
                task_id: row.task_id.clone(),
                no_reward_variance: r
                    .flat_groups
                    .get(row.group_id.as_str())
                    .copied()
                    .unwrap_or(false),
                rollouts: Vec::new(),
            });
            groups.len() - 1
        });
        groups[at].rollouts.push(row);
    }
    let report = Report::of(events);
    let first_two = |i: usize| {
        groups
            .first()
            .and_then(|g| g.rollouts.get(i).or(g.rollouts.first()))
            .map_or(String::new(), |r| r.rollout_id.clone())
    };
    let (default_a, default_b) = (first_two(0), first_two(1));
    RunPage {
        run: run_line(run_id, events),
        versions: report
            .rows
            .iter()
            .map(|v| VersionLine {
                version: version_text(v.version),
                harness: v.harness.clone(),
                rollouts: v.rollouts,
                scored: v.scored,
                passed: v.passed,
                unscored: v.unscored,
                mean_reward: v.mean_reward().map_or("-".into(), |m| format!("{m:.3}")),
                model_calls: v.model_calls,
                tool_calls: v.tool_calls,
                sampled_tokens: v.sampled_tokens,
                tokens_per_second: v
                    .tokens_per_second()
                    .map_or("-".into(), |t| format!("{t:.1}")),
            })
            .collect(),
        published: report
            .published
            .iter()
            .map(|p| PublishedLine {
                version: p.version,
                step: p.step,
                metrics: p
                    .metrics
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.4}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
            .collect(),
        clean: report
            .clean
            .iter()
            .filter(|(_, c)| c.follow_ups > 0)
            .map(|(harness, c)| CleanLine {
                harness: harness.clone(),
                follow_ups: c.follow_ups,
                clean: c.clean,
                rate: c
                    .rate()
                    .map_or("-".into(), |r| format!("{:.1}%", 100.0 * r)),
            })
            .collect(),
        groups,
        default_a,
        default_b,
    }
}
