//! Sessions: one per rollout, found by its API key. The key is the only thing
//! a harness holds, so it is unguessable (256 random bits) and dies with the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::Semaphore;

pub use forgelog_api::NewSession;

#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub run_id: String,
    pub rollout_id: String,
    pub task_id: String,
    pub harness: String,
    pub group_id: String,
    pub started_at_ms: i64,
    pub max_model_calls: Option<u32>,
    pub max_tokens: Option<i64>,
    next_call: AtomicI64,
    model_calls: AtomicU32,
    finished_calls: AtomicI64,
    sampled_tokens: AtomicI64,
    /// Calls in flight hold a permit; finishing takes them all, so it waits for them.
    pub(crate) in_flight: Arc<Semaphore>,
    pub(crate) max_in_flight: u32,
}

impl Session {
    /// The next call's index: 0, 1, 2... in arrival order.
    pub fn next_call_index(&self) -> i64 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes one model call from the budget: false when it is spent.
    pub fn take_model_call(&self) -> bool {
        let used = self.model_calls.fetch_add(1, Ordering::Relaxed);
        self.max_model_calls.is_none_or(|max| used < max)
    }

    /// A `CallFinished` with `sampled` completion tokens was sent.
    pub fn call_finished(&self, sampled: usize) {
        self.finished_calls.fetch_add(1, Ordering::Relaxed);
        self.sampled_tokens
            .fetch_add(sampled as i64, Ordering::Relaxed);
    }

    /// Tokens the model sampled in this session's recorded calls.
    pub fn sampled_tokens(&self) -> i64 {
        self.sampled_tokens.load(Ordering::Relaxed)
    }

    /// CallFinished events sent for this session.
    pub fn finished_calls(&self) -> i64 {
        self.finished_calls.load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SessionError {
    #[error("run_id is required (the proxy was started without --run-id)")]
    NoRunId,
    #[error("session for rollout {0} already exists")]
    Exists(String),
    #[error("no session {0}")]
    Unknown(String),
}

#[derive(Default)]
struct Tables {
    by_key: HashMap<String, Arc<Session>>,
    by_id: HashMap<String, (String, Arc<Session>)>,
}

/// The live sessions.
#[derive(Default)]
pub struct Sessions {
    tables: RwLock<Tables>,
}

impl Sessions {
    /// Creates a session; returns it and its API key.
    pub fn create(
        &self,
        new: NewSession,
        default_run: Option<&str>,
        max_in_flight: u32,
        now_ms: i64,
    ) -> Result<(Arc<Session>, String), SessionError> {
        let run_id = new
            .run_id
            .or_else(|| default_run.map(str::to_string))
            .ok_or(SessionError::NoRunId)?;
        // Deterministic: the same rollout of the same run is the same session.
        let id = forgelog_schemas::event_id("session", &[&run_id, &new.rollout_id]);
        let session = Arc::new(Session {
            id: id.clone(),
            run_id,
            rollout_id: new.rollout_id,
            task_id: new.task_id,
            harness: new.harness,
            group_id: new.group_id,
            started_at_ms: now_ms,
            max_model_calls: new.max_model_calls,
            max_tokens: new.max_tokens,
            next_call: AtomicI64::new(0),
            model_calls: AtomicU32::new(0),
            finished_calls: AtomicI64::new(0),
            sampled_tokens: AtomicI64::new(0),
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
        });
        let key = forgelog_http::random_token();
        let mut t = self.tables.write().expect("sessions lock");
        if t.by_id.contains_key(&id) {
            return Err(SessionError::Exists(session.rollout_id.clone()));
        }
        t.by_key.insert(key.clone(), session.clone());
        t.by_id.insert(id, (key.clone(), session.clone()));
        Ok((session, key))
    }

    pub fn by_id(&self, id: &str) -> Option<Arc<Session>> {
        let t = self.tables.read().expect("sessions lock");
        t.by_id.get(id).map(|(_, s)| s.clone())
    }

    pub fn by_key(&self, key: &str) -> Option<Arc<Session>> {
        self.tables
            .read()
            .expect("sessions lock")
            .by_key
            .get(key)
            .cloned()
    }

    /// Ends a session: its key stops working at once.
    pub fn end(&self, id: &str) -> Result<Arc<Session>, SessionError> {
        let mut t = self.tables.write().expect("sessions lock");
        let (key, session) = t
            .by_id
            .remove(id)
            .ok_or_else(|| SessionError::Unknown(id.to_string()))?;
        t.by_key.remove(&key);
        Ok(session)
    }

    pub fn len(&self) -> usize {
        self.tables.read().expect("sessions lock").by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(rollout: &str) -> NewSession {
        NewSession::new(rollout, "t", "h", "g")
    }

    #[test]
    fn the_call_budget_runs_out_and_stays_out() {
        let s = Sessions::default();
        let (capped, _) = s
            .create(
                NewSession {
                    max_model_calls: Some(2),
                    ..new("capped")
                },
                Some("run"),
                4,
                0,
            )
            .unwrap();
        let taken: Vec<bool> = (0..4).map(|_| capped.take_model_call()).collect();
        assert_eq!(taken, [true, true, false, false]);
        let (open, _) = s.create(new("open"), Some("run"), 4, 0).unwrap();
        assert!((0..100).all(|_| open.take_model_call()));
    }

    #[test]
    fn keys_are_unguessable_and_die_with_the_session() {
        let s = Sessions::default();
        let (a, ka) = s.create(new("r1"), Some("run"), 4, 0).unwrap();
        let (_, kb) = s.create(new("r2"), Some("run"), 4, 0).unwrap();
        assert_ne!(ka, kb);
        assert_eq!(ka.len(), 3 + 64);
        assert_eq!(s.by_key(&ka).unwrap().id, a.id);
        assert_eq!(
            s.create(new("r1"), Some("run"), 4, 0).unwrap_err(),
            SessionError::Exists("r1".into())
        );
        s.end(&a.id).unwrap();
        assert!(s.by_key(&ka).is_none());
        assert!(s.by_key(&kb).is_some());
        assert_eq!(
            s.create(new("r3"), None, 4, 0).unwrap_err(),
            SessionError::NoRunId
        );
    }
}
