//! Sessions: one per rollout, found by its API key. The key is the only thing
//! a harness holds, so it is unguessable (256 random bits), dies with the
//! session, and is kept only as its SHA-256: the log records that hash in
//! `RolloutStarted`, so the table is a projection of the log ([`SessionLog`])
//! and a restarted proxy serves the sessions that were open.

use crate::server::Replicas;
use forgelog_schemas::compact::SessionMemory;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Semaphore;

pub use forgelog_api::{NewSession, Unrouted};
use forgelog_dialects::splice::AnsweredCall;
use std::collections::VecDeque;

/// How many answered calls of a session the proxy keeps to splice onto.
pub const RECENT_ANSWERS: usize = 8;

/// A session keeps the first this many routes it asked for that the proxy
/// does not have (bounded: a client may ask for any path).
pub const UNROUTED_KEPT: usize = 16;

/// The session id of rollout `rollout_id` of run `run_id`: deterministic, so
/// the same rollout of the same run is the same session.
pub fn session_id(run_id: &str, rollout_id: &str) -> String {
    forgelog_schemas::event_id("session", &[run_id, rollout_id])
}

/// SHA-256 of an API key, in hex: how the table and the log know a key.
pub fn key_sha256(key: &str) -> String {
    forgelog_schemas::content_hash(key.as_bytes())
}

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
    /// SHA-256 of its API key (the key itself is never kept).
    pub key_sha256: String,
    /// Taken over from the log by a restarted proxy.
    pub restored: bool,
    /// Its verdict is in the log already (a proxy died between recording it
    /// and the rollout's end): finishing records the end only.
    pub verdict_recorded: bool,
    next_call: AtomicI64,
    model_calls: AtomicU32,
    finished_calls: AtomicI64,
    sampled_tokens: AtomicI64,
    /// Calls in flight hold a permit; finishing takes them all, so it waits for them.
    pub(crate) in_flight: Arc<Semaphore>,
    pub(crate) max_in_flight: u32,
    /// Its recent calls, to record the next ones as what is new in them.
    memory: Mutex<SessionMemory>,
    /// Its recent answered calls, to splice the next prompts onto (token in).
    answered: Mutex<VecDeque<AnsweredCall>>,
    /// Requests with its key to routes the proxy does not have, in order.
    unrouted: Mutex<Vec<Unrouted>>,
}

impl Session {
    pub(crate) fn memory(&self) -> std::sync::MutexGuard<'_, SessionMemory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its recent answered calls, oldest first: what a next prompt is spliced onto.
    pub(crate) fn answered(&self) -> std::sync::MutexGuard<'_, VecDeque<AnsweredCall>> {
        self.answered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `call` to splice later prompts onto, with the
    /// [`RECENT_ANSWERS`] - 1 before it: a sub-agent or a title call
    /// interleaved with the main conversation does not push its base out.
    pub(crate) fn remember_answer(&self, call: AnsweredCall) {
        let mut answered = self.answered();
        if answered.len() == RECENT_ANSWERS {
            answered.pop_front();
        }
        answered.push_back(call);
    }

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

    /// A request with its key to `route` (`METHOD /path`), which the proxy
    /// does not have: what a harness probed for (another server's API).
    pub fn note_unrouted(&self, route: &str) {
        let mut seen = self.unrouted.lock().unwrap_or_else(|p| p.into_inner());
        let route: String = route.chars().take(200).collect();
        if let Some(u) = seen.iter_mut().find(|u| u.route == route) {
            u.count = u.count.saturating_add(1);
        } else if seen.len() < UNROUTED_KEPT {
            seen.push(Unrouted { route, count: 1 });
        }
    }

    /// What [`Session::note_unrouted`] kept.
    pub fn unrouted(&self) -> Vec<Unrouted> {
        self.unrouted.lock().map(|u| u.clone()).unwrap_or_default()
    }

    /// CallFinished events sent for this session.
    pub fn finished_calls(&self) -> i64 {
        self.finished_calls.load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SessionError {
    #[error("run_id is required (the proxy was started without --run)")]
    NoRunId,
    #[error("session for rollout {0} already exists (or already ran: a new attempt takes a new rollout id)")]
    Exists(String),
    #[error("no session {0}")]
    Unknown(String),
    #[error(
        "session {0} belongs to another proxy replica (do the replicas' --replicas lists agree?)"
    )]
    OtherReplica(String),
}

#[derive(Default)]
struct Tables {
    /// By the SHA-256 of the key.
    by_key: HashMap<String, Arc<Session>>,
    by_id: HashMap<String, Arc<Session>>,
    /// Sessions that ended: never opened again, or a second run of a
    /// rollout would reuse its session's call event ids.
    ended: HashSet<String>,
}

/// The live sessions.
#[derive(Default)]
pub struct Sessions {
    tables: RwLock<Tables>,
    /// `replay serve`: a recorded session may be replayed again and again
    /// (nothing is recorded, so no event id is reused).
    reopen_ended: bool,
    /// One of several replicas: this table holds only the sessions it owns.
    replicas: Option<Replicas>,
}

impl Sessions {
    /// The table of `replay serve`, where an ended session may open again.
    pub fn replaying() -> Sessions {
        Sessions {
            reopen_ended: true,
            ..Default::default()
        }
    }

    /// The table of replica `replicas.index`: only the sessions it owns.
    pub fn of_replica(replicas: Option<Replicas>) -> Sessions {
        Sessions {
            replicas,
            ..Default::default()
        }
    }

    /// Creates a session; returns it and its API key.  A replica draws keys
    /// until one is its own, so a call carrying it finds its way here.
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
        let id = session_id(&run_id, &new.rollout_id);
        if self.replicas.as_ref().is_some_and(|r| !r.owns_session(&id)) {
            return Err(SessionError::OtherReplica(id));
        }
        let key = loop {
            let key = forgelog_http::random_token();
            if self
                .replicas
                .as_ref()
                .is_none_or(|r| r.owns_key(&key_sha256(&key)))
            {
                break key;
            }
        };
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
            key_sha256: key_sha256(&key),
            restored: false,
            verdict_recorded: false,
            next_call: AtomicI64::new(0),
            model_calls: AtomicU32::new(0),
            finished_calls: AtomicI64::new(0),
            sampled_tokens: AtomicI64::new(0),
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            memory: Mutex::default(),
            answered: Mutex::default(),
            unrouted: Mutex::default(),
        });
        let mut t = self.tables.write().expect("sessions lock");
        if t.by_id.contains_key(&id) || t.ended.contains(&id) {
            return Err(SessionError::Exists(session.rollout_id.clone()));
        }
        t.by_key.insert(session.key_sha256.clone(), session.clone());
        t.by_id.insert(id, session.clone());
        Ok((session, key))
    }

    /// Takes over what the log says: its open sessions (unless this table
    /// holds them already) and the ids of those that ended.
    pub fn restore(&self, log: &SessionLog, max_in_flight: u32) -> Vec<Arc<Session>> {
        let mut t = self.tables.write().expect("sessions lock");
        t.ended.extend(log.ended.iter().cloned());
        let mut restored = Vec::new();
        for open in log.open.values() {
            let Some(hash) = &open.started.api_key_sha256 else {
                continue; // recorded before v4: its key cannot be matched
            };
            let id = &open.started.session_id;
            let theirs = self.replicas.as_ref().is_some_and(|r| !r.owns_session(id));
            if theirs || t.by_id.contains_key(id) {
                continue;
            }
            let session = Arc::new(open.session(hash, max_in_flight));
            t.by_key.insert(hash.clone(), session.clone());
            t.by_id.insert(session.id.clone(), session.clone());
            restored.push(session);
        }
        restored
    }

    pub fn by_id(&self, id: &str) -> Option<Arc<Session>> {
        let t = self.tables.read().expect("sessions lock");
        t.by_id.get(id).cloned()
    }

    pub fn by_key(&self, key: &str) -> Option<Arc<Session>> {
        self.tables
            .read()
            .expect("sessions lock")
            .by_key
            .get(&key_sha256(key))
            .cloned()
    }

    /// Ends a session: its key stops working at once.
    pub fn end(&self, id: &str) -> Result<Arc<Session>, SessionError> {
        let mut t = self.tables.write().expect("sessions lock");
        let session = t
            .by_id
            .remove(id)
            .ok_or_else(|| SessionError::Unknown(id.to_string()))?;
        t.by_key.remove(&session.key_sha256);
        if !self.reopen_ended {
            t.ended.insert(session.id.clone());
        }
        Ok(session)
    }

    pub fn len(&self) -> usize {
        self.tables.read().expect("sessions lock").by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

mod log;
pub use log::SessionLog;

#[cfg(test)]
mod tests;
