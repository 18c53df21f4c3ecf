//! The demo's tasks and their verifier: arithmetic questions whose answer is
//! one integer, checked against the agent's final message.

use forgelog_api::Verdict;

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: &'static str,
    pub question: &'static str,
    pub answer: i64,
}

pub const TASKS: [Task; 4] = [
    Task {
        id: "product",
        question: "What is 24 times 17?",
        answer: 408,
    },
    Task {
        id: "distance",
        question: "What is 65 times 9?",
        answer: 585,
    },
    Task {
        id: "sum",
        question: "What is 8 plus 5?",
        answer: 13,
    },
    Task {
        id: "small-product",
        question: "What is 6 times 7?",
        answer: 42,
    },
];

/// Reward 1 when the last number in the final answer is the right one, else 0.
pub fn verify(task: &Task, final_answer: &str) -> Verdict {
    match last_number(final_answer) {
        Some(n) if n == task.answer as f64 => {
            Verdict::scored(1.0, format!("answered {n}: correct"))
        }
        Some(n) => Verdict::scored(0.0, format!("answered {n}, expected {}", task.answer)),
        None => Verdict::scored(
            0.0,
            format!("no number in the answer, expected {}", task.answer),
        ),
    }
}

/// The last number in `text` ("1,408", "408.0" and "408." read as numbers).
fn last_number(text: &str) -> Option<f64> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .map(|s| s.trim_matches(|c| c == '.' || c == ',').replace(',', ""))
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_reads_the_last_number() {
        let t = &TASKS[0];
        assert_eq!(
            verify(t, "17 crates of 24 make 408 apples.").reward,
            Some(1.0)
        );
        assert_eq!(verify(t, "The answer is 1,408").reward, Some(0.0));
        assert_eq!(verify(t, "It is 408.0.").reward, Some(1.0));
        assert_eq!(verify(t, "408 or maybe 407").reward, Some(0.0));
        let none = verify(t, "many apples");
        assert_eq!(none.reward, Some(0.0));
        assert!(none.details_text().contains("no number"), "{none:?}");
    }

    #[test]
    fn every_task_states_its_own_answer_correctly() {
        let products = [24 * 17, 65 * 9, 8 + 5, 6 * 7];
        for (t, p) in TASKS.iter().zip(products) {
            assert_eq!(t.answer, p, "{}", t.id);
        }
    }
}
