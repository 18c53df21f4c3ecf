//! `forgelog replay rebuild`'s core: re-derive a run's trajectories and
//! batches from its input events with the same pure cores, and compare them
//! with what the output topics hold (read by the shell crate).

use crate::{Processor, RewardConfig, RewardJoin, TrajectoryBuilder};
use forgelog_schemas::diff::first_difference;
use forgelog_schemas::{Event, Received, Topic};
use std::collections::BTreeMap;

/// Outputs derived again from the inputs, in the order the consumers emit them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rebuilt {
    pub trajectories: Vec<Event>,
    pub batches: Vec<Event>,
}

/// Feeds `inputs` (per topic, in log order) to the two cores the way their
/// shells sweep: each core's input topics in its order.
pub fn rebuild(inputs: &BTreeMap<Topic, Vec<Event>>, rewards: RewardConfig) -> Rebuilt {
    fn drive<P: Processor>(mut p: P, inputs: &BTreeMap<Topic, Vec<Event>>) -> Vec<Event> {
        let mut out = Vec::new();
        for topic in P::INPUTS {
            for e in inputs.get(topic).into_iter().flatten() {
                p.process(e.clone(), &mut out);
            }
        }
        out
    }
    let trajectories = drive(TrajectoryBuilder::default(), inputs);
    let mut with_trajectories = inputs.clone();
    with_trajectories.insert(Topic::Trajectories, trajectories.clone());
    let batches = drive(RewardJoin::new(rewards), &with_trajectories);
    Rebuilt {
        trajectories,
        batches,
    }
}

/// The first place a stored output disagrees with its rebuilt twin.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub topic: Topic,
    pub event: String,
    pub event_id: String,
    /// JSON path of the first differing field, e.g. `sequences[0].token_ids[17]`.
    pub field: String,
    /// Where the stored event sits: (partition, offset); `None` if it is missing.
    pub stored_at: Option<(i32, i64)>,
    pub detail: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .stored_at
            .map_or("not in the topic".to_string(), |(p, o)| {
                format!("partition {p}, offset {o}")
            });
        write!(
            f,
            "{} {} ({}) in {}, {at}: field {}: {}",
            self.event, self.event_id, self.topic, self.topic, self.field, self.detail
        )
    }
}

/// Compares rebuilt events with the stored ones (by event id; order as rebuilt).
pub fn compare(topic: Topic, rebuilt: &[Event], stored: &[Received]) -> Option<Difference> {
    let mut by_id: BTreeMap<String, &Received> = BTreeMap::new();
    for r in stored {
        match &r.event {
            Ok(e) => {
                by_id.insert(e.event_id().to_string(), r);
            }
            Err(why) => {
                return Some(Difference {
                    topic,
                    event: "?".into(),
                    event_id: "?".into(),
                    field: String::new(),
                    stored_at: Some((r.partition, r.offset)),
                    detail: format!("undecodable: {why}"),
                })
            }
        }
    }
    for e in rebuilt {
        let diff = |field: String, stored_at, detail| Difference {
            topic,
            event: e.kind().name().into(),
            event_id: e.event_id().into(),
            field,
            stored_at,
            detail,
        };
        let Some(r) = by_id.remove(e.event_id()) else {
            return Some(diff(
                String::new(),
                None,
                "rebuilt but missing from the topic".into(),
            ));
        };
        let stored = r.event.as_ref().expect("decoded above");
        if stored != e {
            let (a, b) = (
                serde_json::to_value(stored).expect("json"),
                serde_json::to_value(e).expect("json"),
            );
            let (field, detail) =
                first_difference(&a, &b, ("stored", "rebuilt")).unwrap_or_default();
            return Some(diff(field, Some((r.partition, r.offset)), detail));
        }
    }
    by_id.into_values().next().map(|r| {
        let e = r.event.as_ref().expect("decoded above");
        Difference {
            topic,
            event: e.kind().name().into(),
            event_id: e.event_id().into(),
            field: String::new(),
            stored_at: Some((r.partition, r.offset)),
            detail: "in the topic but not rebuilt from the inputs".into(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::{testing::recorded_run, Codec};

    fn stored(events: &[Event]) -> Vec<Received> {
        events
            .iter()
            .enumerate()
            .map(|(i, e)| Received {
                topic: e.topic().name().into(),
                partition: 0,
                offset: i as i64,
                key: e.key().as_bytes().to_vec(),
                value: Codec::global().encode(e).unwrap(),
                event: Ok(e.clone()),
            })
            .collect()
    }

    fn inputs() -> BTreeMap<Topic, Vec<Event>> {
        let mut m: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
        for e in recorded_run("r", 2, 3, 3, 10) {
            m.entry(e.topic()).or_default().push(e);
        }
        m
    }

    #[test]
    fn identical_outputs_compare_equal_and_one_changed_token_is_named() {
        let rebuilt = rebuild(&inputs(), RewardConfig::default());
        assert_eq!((rebuilt.trajectories.len(), rebuilt.batches.len()), (6, 2));
        assert_eq!(
            compare(
                Topic::Trajectories,
                &rebuilt.trajectories,
                &stored(&rebuilt.trajectories)
            ),
            None
        );
        assert_eq!(
            compare(Topic::Batches, &rebuilt.batches, &stored(&rebuilt.batches)),
            None
        );

        let mut edited = rebuilt.trajectories.clone();
        let Event::TrajectoryBuilt(t) = &mut edited[3] else {
            panic!()
        };
        t.sequences[0].token_ids[5] ^= 1;
        let d = compare(Topic::Trajectories, &rebuilt.trajectories, &stored(&edited)).unwrap();
        assert_eq!(d.field, "sequences[0].token_ids[5]");
        assert_eq!(d.stored_at, Some((0, 3)));
        assert_eq!(d.event, "TrajectoryBuilt");
        assert!(d.to_string().contains("offset 3"), "{d}");

        let d = compare(
            Topic::Trajectories,
            &rebuilt.trajectories,
            &stored(&rebuilt.trajectories[1..]),
        )
        .unwrap();
        assert!(d.detail.contains("missing"), "{d}");
    }
}
