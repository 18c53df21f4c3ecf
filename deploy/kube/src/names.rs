//! Kubernetes object names and labels for a run's objects: deterministic
//! (the same attempt is the same Job, so a retried create adopts it), valid
//! DNS-1123 labels (lowercase alphanumerics and '-', at most 63 characters).

use std::collections::BTreeMap;

/// Who manages the objects (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY: &str = "forgelog";
pub const RUN: &str = "forgelog.dev/run";
pub const ROLLOUT: &str = "forgelog.dev/rollout";
pub const ATTEMPT: &str = "forgelog.dev/attempt";
pub const TASK: &str = "forgelog.dev/task";
pub const HARNESS: &str = "forgelog.dev/harness";
pub const ROLE: &str = "forgelog.dev/role";

/// FNV-1a: a short stable digest that needs no dependency.
fn digest(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// `prefix-<id>` as a DNS-1123 label: lowercased, other characters as '-',
/// and when that changed or shortened anything, a digest of the original
/// appended, so distinct ids never share a name.
pub fn object_name(prefix: &str, id: &str) -> String {
    let clean: String = id
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let plain = format!("{prefix}-{clean}");
    if plain.len() <= 63 && clean == id && !clean.ends_with('-') {
        return plain;
    }
    let tail = format!("-{:012x}", digest(id) & 0xffff_ffff_ffff);
    let keep = 63 - tail.len();
    let head: String = plain.chars().take(keep).collect();
    format!("{}{tail}", head.trim_end_matches('-'))
}

/// A label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric
/// at both ends): the value itself when valid, else a cleaned, digested one.
pub fn label_value(v: &str) -> String {
    let valid = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric());
    if valid {
        v.to_string()
    } else {
        object_name("v", v)
    }
}

/// The labels of every object of run `run`.
pub fn run_labels(run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
        (RUN.into(), label_value(run)),
    ])
}

/// `key=value,...`: a label selector for these labels.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Pod labels written `key=value,key=value`, at least one. The run's
/// NetworkPolicy lets sandboxes reach only the pods that carry them: a pair
/// left out for a typo (as `--kube-proxy-labels` once did) could leave it an
/// empty selector, which selects every pod of the namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct PodLabels(pub BTreeMap<String, String>);

impl std::str::FromStr for PodLabels {
    type Err = String;

    fn from_str(s: &str) -> Result<PodLabels, String> {
        let mut labels = BTreeMap::new();
        for pair in s.split(',') {
            match pair.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    labels.insert(k.trim().to_string(), v.trim().to_string());
                }
                _ => return Err(format!("{pair:?} is not a label: key=value,key=value")),
            }
        }
        Ok(PodLabels(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_labels_are_key_value_pairs_and_never_none() {
        let labels: PodLabels = "app.kubernetes.io/name=forgelog-proxy, tier=proxy"
            .parse()
            .unwrap();
        assert_eq!(
            selector(&labels.0),
            "app.kubernetes.io/name=forgelog-proxy,tier=proxy"
        );
        for bad in ["", "app", "app=proxy,", "=proxy", "app=proxy,tier"] {
            let err = bad.parse::<PodLabels>().unwrap_err();
            assert!(err.contains("is not a label"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn names_are_valid_stable_and_distinct() {
        assert_eq!(object_name("fl", "run-a-0"), "fl-run-a-0");
        let long = "r".repeat(100);
        let odd = ["Run_A~1", "run-a-1", "run.a.1", &long, "x-"];
        let names: Vec<String> = odd.iter().map(|id| object_name("fl", id)).collect();
        for n in &names {
            assert!(n.len() <= 63, "{n}");
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            assert!(!n.ends_with('-') && !n.starts_with('-'), "{n}");
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(object_name("fl", "Run_A~1"), names[0], "stable");
        assert_eq!(label_value("hello-file"), "hello-file");
        assert!(label_value("r-t-h-0~1").len() <= 63);
        assert_ne!(label_value("a~1"), label_value("a~2"));
    }
}
