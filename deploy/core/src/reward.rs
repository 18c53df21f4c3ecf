//! What a verifier wrote: `/logs/verifier/reward.json` (a number, or a flat
//! map of named numbers) or `/logs/verifier/reward.txt` (a number). A reward
//! is a finite number; anything else is a typed error, never a 0.

use serde_json::Value;
use std::collections::BTreeMap;

/// A verifier's reward and, for a map, every named number it wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Reward {
    pub value: f64,
    pub parts: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error("the verifier wrote neither reward.json nor reward.txt")]
    Missing,
    #[error("{file}: {why}")]
    Invalid { file: &'static str, why: String },
}

/// Reads the reward from the verifier's files' contents: `reward.json` when
/// present, else `reward.txt`. In a map, the reward is its `reward` entry, or
/// its only entry.
pub fn read_reward(json: Option<&str>, txt: Option<&str>) -> Result<Reward, RewardError> {
    match (json, txt) {
        (Some(json), _) => from_json(json),
        (None, Some(txt)) => from_text(txt),
        (None, None) => Err(RewardError::Missing),
    }
}

fn invalid(file: &'static str, why: impl Into<String>) -> RewardError {
    RewardError::Invalid {
        file,
        why: why.into(),
    }
}

fn finite(file: &'static str, what: &str, v: Option<f64>) -> Result<f64, RewardError> {
    match v {
        Some(x) if x.is_finite() => Ok(x),
        Some(x) => Err(invalid(file, format!("{what} is {x}, not a finite number"))),
        None => Err(invalid(file, format!("{what} is not a number"))),
    }
}

fn from_json(text: &str) -> Result<Reward, RewardError> {
    const FILE: &str = "reward.json";
    let v: Value = serde_json::from_str(text).map_err(|e| invalid(FILE, e.to_string()))?;
    match v {
        Value::Object(map) => {
            let mut parts = BTreeMap::new();
            for (k, v) in &map {
                parts.insert(k.clone(), finite(FILE, &format!("\"{k}\""), v.as_f64())?);
            }
            let value = match (parts.get("reward"), parts.len()) {
                (Some(r), _) => *r,
                (None, 1) => *parts.values().next().expect("one entry"),
                (None, 0) => return Err(invalid(FILE, "an empty map")),
                (None, _) => {
                    return Err(invalid(
                        FILE,
                        "several numbers and none of them named \"reward\"",
                    ))
                }
            };
            Ok(Reward { value, parts })
        }
        other => Ok(Reward {
            value: finite(FILE, "the reward", other.as_f64())?,
            parts: BTreeMap::new(),
        }),
    }
}

fn from_text(text: &str) -> Result<Reward, RewardError> {
    const FILE: &str = "reward.txt";
    let t = text.trim();
    if t.is_empty() {
        return Err(invalid(FILE, "empty"));
    }
    let value = t
        .parse::<f64>()
        .map_err(|_| invalid(FILE, format!("{t:?} is not a number")))?;
    Ok(Reward {
        value: finite(FILE, "the reward", Some(value))?,
        parts: BTreeMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numbers_and_maps_read_and_everything_else_is_a_typed_error() {
        assert_eq!(read_reward(None, Some(" 1\n")).unwrap().value, 1.0);
        assert_eq!(read_reward(Some("0.25"), Some("1")).unwrap().value, 0.25);
        let r = read_reward(Some(r#"{"reward": 0.5, "tests_passed": 3}"#), None).unwrap();
        assert_eq!((r.value, r.parts["tests_passed"]), (0.5, 3.0));
        assert_eq!(
            read_reward(Some(r#"{"accuracy": 0.75}"#), None)
                .unwrap()
                .value,
            0.75
        );
        assert_eq!(read_reward(None, None), Err(RewardError::Missing));
        for (json, txt, says) in [
            (None, Some("NaN"), "not a finite number"),
            (None, Some("inf"), "not a finite number"),
            (None, Some(""), "empty"),
            (None, Some("passed"), "not a number"),
            (Some("\"1\""), None, "not a number"),
            (Some("true"), None, "not a number"),
            (Some("{\"a\": 1, \"b\": 2}"), None, "none of them named"),
            (Some("{\"reward\": \"high\"}"), None, "not a number"),
            (Some("{}"), None, "empty map"),
            (Some("{nope"), None, "key must be a string"),
        ] {
            let err = read_reward(json, txt).unwrap_err().to_string();
            assert!(err.contains(says), "{json:?} {txt:?}: {err}");
        }
    }

    proptest! {
        #[test]
        fn any_finite_number_round_trips_through_both_files(x in -1e9f64..1e9) {
            prop_assert_eq!(read_reward(None, Some(&x.to_string())).unwrap().value, x);
            // serde_json's fast float parser may land one ulp away.
            let json = read_reward(Some(&serde_json::json!(x).to_string()), None).unwrap().value;
            prop_assert!((json - x).abs() <= x.abs() * 2.0 * f64::EPSILON, "{json} vs {x}");
        }
    }
}
