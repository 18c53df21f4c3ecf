//! What the cluster says about a run's attempts: one watcher on its Jobs and
//! one on its Pods (relisting after any break), and a periodic list that
//! catches what a watch missed, all folded into a [`Tracker`] by attempt.

use crate::names;
use crate::retry::retrying;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use kube::Api;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the watchers know of one attempt (by its attempt label).
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// When a watch or a list first showed the attempt's Job.
    pub job_seen_at: Option<Instant>,
    pub job_gone: bool,
    /// A Job condition `Failed` with this reason (e.g. `DeadlineExceeded`).
    pub job_failed: Option<String>,
    pub pending_since: Option<Instant>,
    /// The container ended: its reason and termination message.
    pub terminated: Option<(String, String)>,
}

#[derive(Default)]
pub(crate) struct Tracker {
    pub seen: Mutex<BTreeMap<String, Seen>>,
    pub changed: tokio::sync::Notify,
}

impl Tracker {
    pub fn update(&self, attempt: &str, f: impl FnOnce(&mut Seen)) {
        f(self
            .seen
            .lock()
            .expect("tracker")
            .entry(attempt.to_string())
            .or_default());
        self.changed.notify_waiters();
    }

    pub fn get(&self, attempt: &str) -> Seen {
        self.seen
            .lock()
            .expect("tracker")
            .get(attempt)
            .cloned()
            .unwrap_or_default()
    }
}

fn attempt_of(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(names::ATTEMPT).cloned()
}

pub(crate) fn on_job(t: &Tracker, job: &Job, gone: bool) {
    let Some(a) = attempt_of(&job.metadata) else {
        return;
    };
    let failed = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "Failed" && c.status == "True")
        })
        .map(|c| c.reason.clone().unwrap_or_default());
    t.update(&a, |s| {
        s.job_seen_at.get_or_insert_with(Instant::now);
        s.job_gone |= gone;
        if failed.is_some() {
            s.job_failed = failed;
        }
    });
}

pub(crate) fn on_pod(t: &Tracker, pod: &Pod) {
    let Some(a) = attempt_of(&pod.metadata) else {
        return;
    };
    let status = pod.status.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "attempt")
        .and_then(|c| c.state?.terminated)
        .map(|t| (t.reason.unwrap_or_default(), t.message.unwrap_or_default()));
    let pending = status.phase.as_deref() == Some("Pending");
    t.update(&a, |s| {
        if pending {
            s.pending_since.get_or_insert_with(Instant::now);
        } else {
            s.pending_since = None;
        }
        if terminated.is_some() {
            s.terminated = terminated;
        }
    });
}

/// Follows `api`'s objects of the run until the backend is dropped; after a
/// relist, objects that were not listed again are gone.
pub(crate) fn follow<K>(
    api: Api<K>,
    sel: String,
    tracker: Arc<Tracker>,
    on: fn(&Tracker, &K, bool),
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default().labels(&sel)).default_backoff();
        futures::pin_mut!(stream);
        let mut listed: Option<Vec<K>> = None;
        let mut known: BTreeSet<String> = BTreeSet::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => listed = Some(Vec::new()),
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(l) = listed.as_mut() {
                        l.push(o.clone());
                    }
                    on(&tracker, &o, false);
                }
                Ok(watcher::Event::InitDone) => {
                    let now: BTreeSet<String> = listed
                        .take()
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|o| o.meta().name.clone())
                        .collect();
                    // Deleted while the watch was down.
                    for name in known.difference(&now) {
                        tracing::debug!(%name, "gone across a relist");
                    }
                    known = now;
                }
                Ok(watcher::Event::Apply(o)) => {
                    known.extend(o.meta().name.clone());
                    on(&tracker, &o, false);
                }
                Ok(watcher::Event::Delete(o)) => {
                    if let Some(n) = &o.meta().name {
                        known.remove(n);
                    }
                    on(&tracker, &o, true);
                }
                Err(e) => tracing::warn!(error = %e, "watching the run's objects"),
            }
        }
    })
}

/// Every `every`, lists the run's Jobs and Pods and applies what it finds
/// (a missed watch event is caught here): a Job the tracker saw that is no
/// longer listed is gone.
pub(crate) fn reconcile(
    jobs: Api<Job>,
    pods: Api<Pod>,
    sel: String,
    tracker: Arc<Tracker>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let lp = kube::api::ListParams::default().labels(&sel);
        loop {
            tokio::time::sleep(every).await;
            let listing = Instant::now();
            let (Ok(listed), Ok(pod_list)) = (
                retrying(|| jobs.list(&lp)).await,
                retrying(|| pods.list(&lp)).await,
            ) else {
                continue;
            };
            let live: BTreeSet<String> = listed
                .items
                .iter()
                .filter_map(|j| attempt_of(&j.metadata))
                .collect();
            for job in &listed.items {
                on_job(&tracker, job, false);
            }
            for pod in &pod_list.items {
                on_pod(&tracker, pod);
            }
            let seen: Vec<String> = tracker
                .seen
                .lock()
                .expect("tracker")
                .iter()
                // Seen before the list began, and not in it: deleted.
                .filter(|(a, s)| {
                    s.job_seen_at.is_some_and(|t| t < listing) && !s.job_gone && !live.contains(*a)
                })
                .map(|(a, _)| a.clone())
                .collect();
            for a in seen {
                tracker.update(&a, |s| s.job_gone = true);
            }
        }
    })
}
