//! One object per run that owns all of its objects: a ConfigMap the
//! orchestrator renews as a lease. A run whose lease expired has no live
//! orchestrator: deleting its lease lets the garbage collector remove its
//! Jobs, Pods, Secrets and ConfigMaps. Killing the orchestrator leaks
//! nothing past one lease.

use crate::names::{self, object_name};
use crate::retry::{retrying, KubeError};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const POST: PostParams = PostParams {
    dry_run: false,
    field_manager: None,
};
static BACKGROUND: std::sync::LazyLock<DeleteParams> =
    std::sync::LazyLock::new(DeleteParams::background);
static MERGE: std::sync::LazyLock<PatchParams> = std::sync::LazyLock::new(PatchParams::default);

const RENEWED: &str = "forgelog.dev/renewed-at";
const SECONDS: &str = "forgelog.dev/lease-seconds";
const ROLE: &str = "run-lease";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn lease_name(run: &str) -> String {
    object_name("forgelog-run", run)
}

/// Whether a lease object says its orchestrator is gone at `now` (seconds).
pub fn expired(lease: &ConfigMap, now: u64) -> bool {
    let a = lease.metadata.annotations.clone().unwrap_or_default();
    let num = |k: &str| a.get(k).and_then(|v| v.parse::<u64>().ok());
    match (num(RENEWED), num(SECONDS)) {
        (Some(at), Some(secs)) => now > at + secs,
        // Not a lease forgelog wrote: never ours to delete.
        _ => false,
    }
}

/// A run's lease, held while this orchestrator lives.
pub struct RunLease {
    pub owner: OwnerReference,
    renew: tokio::task::JoinHandle<()>,
}

impl Drop for RunLease {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

impl RunLease {
    /// Takes run `run`'s lease (a fresh one, or one whose holder is gone)
    /// and renews it every third of `seconds` until dropped.
    pub async fn acquire(
        api: &Api<ConfigMap>,
        run: &str,
        seconds: u64,
    ) -> Result<RunLease, KubeError> {
        let name = lease_name(run);
        let annotations = |at: u64| {
            BTreeMap::from([
                (RENEWED.to_string(), at.to_string()),
                (SECONDS.to_string(), seconds.to_string()),
            ])
        };
        let mut labels = names::run_labels(run);
        labels.insert(names::ROLE.into(), ROLE.into());
        let lease = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                annotations: Some(annotations(now())),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = match retrying(|| api.create(&POST, &lease)).await {
            Ok(c) => c,
            Err(KubeError::Api { code: 409, .. }) => {
                let held = retrying(|| api.get(&name)).await?;
                if !expired(&held, now()) {
                    return Err(KubeError::Busy(run.to_string()));
                }
                let patch = Patch::Merge(
                    serde_json::json!({"metadata": {"annotations": annotations(now())}}),
                );
                retrying(|| api.patch(&name, &MERGE, &patch)).await?
            }
            Err(e) => return Err(e),
        };
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: name.clone(),
            uid: created.metadata.uid.clone().unwrap_or_default(),
            block_owner_deletion: Some(false),
            controller: Some(false),
        };
        let (api, every) = (api.clone(), Duration::from_secs((seconds / 3).max(1)));
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let patch = Patch::Merge(
                    serde_json::json!({"metadata": {"annotations": {RENEWED: now().to_string()}}}),
                );
                if let Err(e) = retrying(|| api.patch(&name, &MERGE, &patch)).await {
                    tracing::warn!(lease = %name, error = %e, "renewing the run's lease");
                }
            }
        });
        Ok(RunLease { owner, renew })
    }

    /// Deletes every run lease in `api`'s namespace that expired: their
    /// objects go with them. Returns the leases deleted.
    pub async fn expire_dead(api: &Api<ConfigMap>) -> Result<Vec<String>, KubeError> {
        let lp = ListParams::default().labels(&format!("{}={ROLE}", names::ROLE));
        let leases = retrying(|| api.list(&lp)).await?;
        let mut gone = Vec::new();
        for lease in leases.items.iter().filter(|l| expired(l, now())) {
            let name = lease.metadata.name.clone().unwrap_or_default();
            match retrying(|| api.delete(&name, &BACKGROUND)).await {
                Ok(_) | Err(KubeError::Api { code: 404, .. }) => gone.push(name),
                Err(e) => return Err(e),
            }
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_its_seconds_and_foreign_objects_never_do() {
        let lease = |a: &[(&str, &str)]| ConfigMap {
            metadata: ObjectMeta {
                annotations: Some(
                    a.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let held = lease(&[(RENEWED, "1000"), (SECONDS, "30")]);
        assert!(!expired(&held, 1030));
        assert!(expired(&held, 1031));
        assert!(!expired(&lease(&[]), u64::MAX));
    }
}
