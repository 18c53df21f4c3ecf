//! Topic names and which event goes where, keyed by what.

/// The log's topics; `schemas/README.md` lists their keys and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    Calls,
    Rollouts,
    Rewards,
    Trajectories,
    Batches,
    Policy,
    /// Messages a consumer could not read, with the reason.
    DeadLetters,
}

impl Topic {
    pub const ALL: [Topic; 7] = [
        Topic::Calls,
        Topic::Rollouts,
        Topic::Rewards,
        Topic::Trajectories,
        Topic::Batches,
        Topic::Policy,
        Topic::DeadLetters,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topic::Calls => "forgelog.calls",
            Topic::Rollouts => "forgelog.rollouts",
            Topic::Rewards => "forgelog.rewards",
            Topic::Trajectories => "forgelog.trajectories",
            Topic::Batches => "forgelog.batches",
            Topic::Policy => "forgelog.policy",
            Topic::DeadLetters => "forgelog.deadletters",
        }
    }

    pub fn from_name(name: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
