//! The runner's report, as the pod's termination message, back into how the
//! agent and the verifier ended (the same types the local backend returns).

use forgelog_deploy_core::outcome::{AgentEnd, Stage, VerifierEnd};
use forgelog_deploy_core::reward::read_reward;
use serde::Deserialize;

/// The script every attempt's pod runs.
pub const RUNNER: &str = include_str!("runner.sh");

#[derive(Debug, Deserialize)]
struct Report {
    agent: String,
    verifier: String,
    reward_json: String,
    reward_txt: String,
}

/// Standard base64 (as coreutils writes it, and as Kubernetes carries
/// Secret and ConfigMap bytes) to bytes; other characters are skipped.
pub fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut bits, mut n, mut out) = (0u32, 0, Vec::new());
    for c in text.bytes() {
        let Some(v) = ALPHABET.iter().position(|&a| a == c) else {
            continue;
        };
        bits = (bits << 6) | v as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    out
}

/// A reward file as the runner reported it (`-`: not written).
fn decode(b64: &str) -> Option<String> {
    (b64 != "-").then(|| String::from_utf8_lossy(&base64(b64)).into_owned())
}

fn exit(s: &str) -> Option<i32> {
    s.strip_prefix("exit:")?.parse().ok()
}

/// How an attempt ended, from its pod's termination message.
pub fn read_report(message: &str) -> (AgentEnd, VerifierEnd) {
    let report: Report = match serde_json::from_str(message.trim()) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("the pod's runner left no report ({e}): {message:.200}");
            return (
                AgentEnd::Failed {
                    stage: Stage::Harness,
                    why: why.clone(),
                },
                VerifierEnd::Failed {
                    stage: Stage::Verifier,
                    why,
                },
            );
        }
    };
    let agent = match (report.agent.as_str(), exit(&report.agent)) {
        ("timed_out", _) => AgentEnd::TimedOut,
        (_, Some(code)) => AgentEnd::Exited(code),
        (other, None) => AgentEnd::Failed {
            stage: Stage::Harness,
            why: format!("runner said agent {other:?}"),
        },
    };
    let verifier = match (report.verifier.as_str(), exit(&report.verifier)) {
        ("timed_out", _) => VerifierEnd::TimedOut,
        (_, code) => VerifierEnd::Ran {
            code,
            reward: read_reward(
                decode(&report.reward_json).as_deref(),
                decode(&report.reward_txt).as_deref(),
            ),
        },
    };
    (agent, verifier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_deploy_core::outcome::judge;

    #[test]
    fn reports_read_back_into_typed_ends() {
        // "MQo=" is "1\n".
        let ok = r#"{"agent":"exit:0","verifier":"exit:0","reward_json":"-","reward_txt":"MQo="}"#;
        let (a, v) = read_report(ok);
        let (status, verdict) = judge(&a, &v);
        assert_eq!(
            (status.name(), verdict.reward),
            ("scored".into(), Some(1.0))
        );
        let cases = [
            (
                r#"{"agent":"timed_out","verifier":"exit:0","reward_json":"-","reward_txt":"MQo="}"#,
                "agent_timeout",
            ),
            (
                r#"{"agent":"exit:0","verifier":"exit:0","reward_json":"-","reward_txt":"-"}"#,
                "reward_missing",
            ),
            (
                r#"{"agent":"exit:0","verifier":"exit:3","reward_json":"-","reward_txt":"-"}"#,
                "verifier_error",
            ),
            (
                r#"{"agent":"exit:0","verifier":"timed_out","reward_json":"-","reward_txt":"-"}"#,
                "verifier_timeout",
            ),
            // "TmFO" is "NaN".
            (
                r#"{"agent":"exit:0","verifier":"exit:0","reward_json":"-","reward_txt":"TmFO"}"#,
                "reward_invalid",
            ),
            ("", "infra:harness"),
        ];
        for (message, want) in cases {
            let (a, v) = read_report(message);
            let (status, verdict) = judge(&a, &v);
            assert_eq!(status.name(), want, "{message}");
            assert_eq!(verdict.reward, None);
        }
        assert_eq!(
            decode("eyJyZXdhcmQiOiAwLjV9"),
            Some(r#"{"reward": 0.5}"#.into())
        );
    }
}
