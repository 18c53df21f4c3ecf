//! Lenient matching: what a re-run cannot send the same (dates, UUIDs,
//! temporary paths, version stamps, what the user marks volatile), masked in
//! one place, and the report of every call answered although it differed.

use super::Divergence;
use serde_json::Value;

/// How replay compares a re-sent call with its recording.
#[derive(Debug, Clone, Default)]
pub enum Matching {
    /// Byte-for-byte equal chat forms, else the call is refused (SDK sessions, tests).
    #[default]
    Strict,
    /// Every call is answered from the recording; differences are reported,
    /// as explained where only [`Normaliser`]'s volatile fields differ.
    Lenient(Normaliser),
}

/// One call of a replay report: where it differed, and whether only volatile fields did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReportEntry {
    #[serde(flatten)]
    pub divergence: Divergence,
    pub explained: bool,
}

/// A replay report in words: how many calls differed, then one line each.
pub fn report_text(report: &[ReportEntry]) -> String {
    let explained = report.iter().filter(|e| e.explained).count();
    let mut text = format!(
        "replay report: {} calls differed from the recording ({explained} only in volatile fields, {} not)\n",
        report.len(),
        report.len() - explained
    );
    for e in report {
        let why = if e.explained { "volatile" } else { "DIFFERS" };
        text.push_str(&format!("  [{why}] {}\n", e.divergence));
    }
    text
}

/// What cannot be the same in a re-run, in one place: dates and times, UUIDs,
/// temporary paths, version stamps and hashes, and what the user marks
/// volatile. Each is replaced by a placeholder in every string of a request
/// before a lenient replay compares it again.
#[derive(Debug, Clone)]
pub struct Normaliser {
    patterns: Vec<(regex::Regex, String)>,
}

/// The known volatile fields: (pattern, placeholder).
const VOLATILE: &[(&str, &str)] = &[
    // 2026-12-01, 2026-12-01T05:29:49.315Z, 2026-12-01 05:29:49+00:00
    (
        r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",
        "<date>",
    ),
    // Tue Dec 1 2026, Tuesday, December 1, 2026, 12/1/2026
    (
        r"(?i)\b(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*,? (?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* \d{1,2},? \d{4}\b",
        "<date>",
    ),
    (r"\b\d{1,2}/\d{1,2}/\d{4}\b", "<date>"),
    (r"\b\d{2}:\d{2}:\d{2}\b", "<time>"),
    (
        r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",
        "<uuid>",
    ),
    (
        r"(?:/tmp|/var/tmp|/var/folders|/private/var/folders)/[^\s\x22'`)]+",
        "<tmp>",
    ),
    // Claude Code's billing header and the like: `cc_version=2.0.14.3a1`
    (
        r"(?i)\b(version|cc_version|build)=[0-9A-Za-z._-]+",
        "$1=<version>",
    ),
    // Codex's shell output header: a random chunk id, the command's wall time.
    (r"Chunk ID: [0-9a-f]+", "Chunk ID: <id>"),
    (r"Wall time: [0-9.]+ seconds", "Wall time: <duration>"),
    // Process ids in shell tool output (Gemini CLI's and Qwen Code's `Process Group PGID: 35`).
    (r"\b(PGID|PID|pid): \d+", "$1: <pid>"),
    (r"(?i)\b[0-9a-f]{12,64}\b", "<hash>"),
];

impl Default for Normaliser {
    fn default() -> Normaliser {
        Normaliser::known()
    }
}

impl Normaliser {
    /// The known volatile fields.
    pub fn known() -> Normaliser {
        Normaliser {
            patterns: VOLATILE
                .iter()
                .map(|(p, to)| {
                    (
                        regex::Regex::new(p).expect("a valid pattern"),
                        to.to_string(),
                    )
                })
                .collect(),
        }
    }

    /// The known ones and `extra` patterns (regular expressions) the user marks volatile.
    pub fn with_volatile(extra: &[String]) -> Result<Normaliser, regex::Error> {
        let mut n = Normaliser::known();
        for p in extra {
            n.patterns
                .push((regex::Regex::new(p)?, "<volatile>".into()));
        }
        Ok(n)
    }

    /// `value` with every string's volatile parts replaced by placeholders.
    pub fn normalise(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => {
                let mut s = s.clone();
                for (re, to) in &self.patterns {
                    s = re.replace_all(&s, to.as_str()).into_owned();
                }
                Value::String(s)
            }
            Value::Array(items) => Value::Array(items.iter().map(|v| self.normalise(v)).collect()),
            Value::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), self.normalise(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}
