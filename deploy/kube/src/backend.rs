//! `forgelog run --backend kube`: each attempt a Job, watched (one watcher on
//! the run's Jobs and one on its Pods, relisting after any break) until its
//! pod's runner reports through the termination message; a Job that
//! disappears, a pod that cannot be scheduled and a deadline that passes end
//! the attempt with their typed status, never a 0.

use crate::job::{files_name, task_files, AttemptObjects, BundleSource};
use crate::lease::RunLease;
use crate::names::{self, label_value, selector};
use crate::retry::{retrying, KubeError};
use crate::termination::read_report;
use crate::watch::{follow, on_job, on_pod, reconcile, Tracker};
use forgelog_deploy::harness::Launch;
use forgelog_deploy::orchestrator::{Attempt, ImageBuilder, SandboxBackend};
use forgelog_deploy_core::outcome::{infra, AgentEnd, Stage, VerifierEnd};
use forgelog_deploy_core::Task;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

// Params the calls borrow, for as long as their retries run.
const POST: PostParams = PostParams {
    dry_run: false,
    field_manager: None,
};
static BACKGROUND: std::sync::LazyLock<DeleteParams> =
    std::sync::LazyLock::new(DeleteParams::background);

/// Where task images come from.
#[derive(Debug, Clone)]
pub enum TaskImages {
    /// Built here (by podman: single-node clusters that see local images, the fake kubelet).
    BuiltLocally(Arc<dyn ImageBuilder>),
    /// `PREFIX/forgelog-task-ID:latest`, built and pushed beforehand
    /// (a task's own `docker_image` wins either way).
    Registry(String),
}

#[derive(Debug, Clone)]
pub struct KubeOptions {
    pub namespace: String,
    /// The proxy as pods reach it (its Service), e.g. `http://forgelog-proxy:8100`.
    pub proxy_url: String,
    /// The proxy pods' labels: the run's NetworkPolicy allows egress to them only (and DNS).
    pub proxy_labels: BTreeMap<String, String>,
    pub proxy_port: i32,
    pub bundles: BundleSource,
    pub images: TaskImages,
    /// A pod still pending after this is `infra:schedule`.
    pub schedule_timeout: Duration,
    /// Job creations per second at most.
    pub creates_per_second: f64,
    pub lease_seconds: u64,
    /// How often the run's Jobs and Pods are listed besides being watched.
    pub reconcile_every: Duration,
}

pub struct KubeBackend {
    client: Client,
    options: KubeOptions,
    run_id: String,
    lease: RunLease,
    tracker: Arc<Tracker>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    /// (task, harness) whose files ConfigMap exists.
    files: tokio::sync::Mutex<BTreeSet<(String, String)>>,
    next_create: tokio::sync::Mutex<Instant>,
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        self.watchers.iter().for_each(|w| w.abort());
    }
}

impl KubeBackend {
    /// Deletes the runs whose lease expired, takes run `run_id`'s lease, makes
    /// its NetworkPolicy and starts following its Jobs and Pods.
    pub async fn start(
        client: Client,
        options: KubeOptions,
        run_id: &str,
    ) -> Result<KubeBackend, KubeError> {
        let ns = &options.namespace;
        let leases: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let expired = RunLease::expire_dead(&leases).await?;
        if !expired.is_empty() {
            tracing::info!(?expired, "deleted the runs whose orchestrator is gone");
        }
        let lease = RunLease::acquire(&leases, run_id, options.lease_seconds).await?;
        let mut labels = names::run_labels(run_id);
        let policy = NetworkPolicy {
            metadata: ObjectMeta {
                name: Some(names::object_name("forgelog-egress", run_id)),
                labels: Some(labels.clone()),
                owner_references: Some(vec![lease.owner.clone()]),
                ..Default::default()
            },
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..Default::default()
                }),
                policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
                egress: Some(vec![
                    NetworkPolicyEgressRule {
                        to: Some(vec![NetworkPolicyPeer {
                            pod_selector: Some(LabelSelector {
                                match_labels: Some(options.proxy_labels.clone()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                        ports: Some(vec![NetworkPolicyPort {
                            port: Some(IntOrString::Int(options.proxy_port)),
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        }]),
                    },
                    NetworkPolicyEgressRule {
                        to: None,
                        ports: Some(
                            ["UDP", "TCP"]
                                .iter()
                                .map(|p| NetworkPolicyPort {
                                    port: Some(IntOrString::Int(53)),
                                    protocol: Some(p.to_string()),
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                    },
                ]),
                ingress: Some(vec![]),
            }),
        };
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
        match retrying(|| policies.create(&POST, &policy)).await {
            Ok(_) | Err(KubeError::Api { code: 409, .. }) => {}
            Err(e) => return Err(e),
        }
        let tracker = Arc::new(Tracker::default());
        let sel = selector(&labels);
        labels.clear();
        let watchers = vec![
            follow::<Job>(
                Api::namespaced(client.clone(), ns),
                sel.clone(),
                tracker.clone(),
                on_job,
            ),
            follow::<Pod>(
                Api::namespaced(client.clone(), ns),
                sel.clone(),
                tracker.clone(),
                |t, p, _| on_pod(t, p),
            ),
            reconcile(
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                sel,
                tracker.clone(),
                options.reconcile_every,
            ),
        ];
        Ok(KubeBackend {
            client,
            options,
            run_id: run_id.to_string(),
            lease,
            tracker,
            watchers,
            files: Default::default(),
            next_create: tokio::sync::Mutex::new(Instant::now()),
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.options.namespace)
    }

    /// Waits for the next free Job creation slot.
    async fn pace(&self) {
        let gap = Duration::from_secs_f64(1.0 / self.options.creates_per_second.max(0.001));
        let mut next = self.next_create.lock().await;
        let now = Instant::now();
        if *next > now {
            tokio::time::sleep(*next - now).await;
        }
        *next = (*next).max(now) + gap;
    }

    async fn ensure_files(&self, a: &Attempt<'_>) -> Result<(), KubeError> {
        let key = (a.task.id.clone(), a.harness.name.clone());
        let mut made = self.files.lock().await;
        if made.contains(&key) {
            return Ok(());
        }
        let read = |p: std::path::PathBuf| {
            std::fs::read(&p).map_err(|e| KubeError::Client(format!("{}: {e}", p.display())))
        };
        let mut files = BTreeMap::new();
        files.insert(
            "instruction.md".to_string(),
            read(a.task.dir.join("instruction.md"))?,
        );
        match &a.harness.launch {
            Launch::Script(s) => {
                files.insert("launch.sh".to_string(), s.clone().into_bytes());
            }
            Launch::Solution => {
                if let Some(s) = a.task.solution() {
                    files.insert("solve.sh".to_string(), read(s)?);
                }
            }
        }
        let mut tar = tar::Builder::new(Vec::new());
        tar.append_dir_all(".", a.task.dir.join("tests"))
            .map_err(|e| {
                KubeError::Client(format!("packing {}/tests: {e}", a.task.dir.display()))
            })?;
        files.insert(
            "tests.tar".to_string(),
            tar.into_inner()
                .map_err(|e| KubeError::Client(e.to_string()))?,
        );
        let name = files_name(&self.run_id, &a.task.id, &a.harness.name);
        let cm = task_files(
            &name,
            &self.options.namespace,
            names::run_labels(&self.run_id),
            &self.lease.owner,
            files,
        );
        let api: Api<ConfigMap> = self.api();
        match retrying(|| api.create(&POST, &cm)).await {
            Ok(_) | Err(KubeError::Api { code: 409, .. }) => {}
            Err(e) => return Err(e),
        }
        made.insert(key);
        Ok(())
    }

    async fn attempt(&self, a: &Attempt<'_>) -> Result<(AgentEnd, VerifierEnd), (Stage, String)> {
        let sandbox = |e: KubeError| (Stage::Sandbox, e.to_string());
        self.ensure_files(a).await.map_err(sandbox)?;
        let cfg = &a.task.config;
        let objects = AttemptObjects {
            namespace: &self.options.namespace,
            run_id: a.run_id,
            rollout_id: &a.rollout.id,
            attempt_id: a.id,
            task_id: &a.task.id,
            harness: &a.harness.name,
            image: a.image,
            proxy_url: &self.options.proxy_url,
            api_key: a.api_key,
            bundles: &self.options.bundles,
            solve: a.harness.launch == Launch::Solution,
            agent_timeout_sec: cfg.agent.timeout_sec,
            verifier_timeout_sec: cfg.verifier.timeout_sec,
            slack_sec: 120,
            cpus: cfg.environment.cpus,
            memory_mb: cfg.environment.memory_mb,
            owner: &self.lease.owner,
        };
        let secrets: Api<Secret> = self.api();
        let secret = objects.secret();
        match retrying(|| secrets.create(&POST, &secret)).await {
            Ok(_) => {}
            Err(KubeError::Api { code: 409, .. }) => {
                let name = objects.secret_name();
                retrying(|| secrets.replace(&name, &POST, &secret))
                    .await
                    .map_err(sandbox)?;
            }
            Err(e) => return Err(sandbox(e)),
        }
        self.pace().await;
        let jobs: Api<Job> = self.api();
        let job = objects.job();
        match retrying(|| jobs.create(&POST, &job)).await {
            // 409: this attempt's Job exists (a create retried after a lost answer): adopt it.
            Ok(_) | Err(KubeError::Api { code: 409, .. }) => {}
            Err(e @ KubeError::Api { code: 422, .. }) => return Err(sandbox(e)),
            Err(e) => return Err(sandbox(e)),
        }
        let ends = self.wait(&label_value(a.id), objects.deadline_sec()).await;
        let name = objects.job_name();
        let _ = retrying(|| jobs.delete(&name, &BACKGROUND)).await;
        let secret_name = objects.secret_name();
        let _ = retrying(|| secrets.delete(&secret_name, &BACKGROUND)).await;
        ends
    }

    /// Until the attempt's pod reports, or its Job is gone, failed, or stuck.
    async fn wait(
        &self,
        attempt: &str,
        deadline_sec: i64,
    ) -> Result<(AgentEnd, VerifierEnd), (Stage, String)> {
        // A margin over the server's deadline for a server that never says.
        let give_up = Instant::now() + Duration::from_secs(deadline_sec as u64 + 300);
        loop {
            let changed = self.tracker.changed.notified();
            let seen = self.tracker.get(attempt);
            if let Some((reason, message)) = &seen.terminated {
                if reason == "OOMKilled" {
                    return Err((
                        Stage::Harness,
                        "the pod was OOMKilled at its memory limit".into(),
                    ));
                }
                return Ok(read_report(message));
            }
            if seen.job_failed.as_deref() == Some("DeadlineExceeded") {
                return Ok((AgentEnd::TimedOut, VerifierEnd::TimedOut));
            }
            if let Some(reason) = &seen.job_failed {
                return Err((Stage::Sandbox, format!("the Job failed: {reason}")));
            }
            if seen.job_gone {
                return Err((Stage::Sandbox, "the attempt's Job was deleted".into()));
            }
            if seen
                .pending_since
                .is_some_and(|t| t.elapsed() > self.options.schedule_timeout)
            {
                return Err((
                    Stage::Schedule,
                    format!(
                        "the pod stayed Pending for {} s",
                        self.options.schedule_timeout.as_secs()
                    ),
                ));
            }
            if Instant::now() > give_up {
                return Err((
                    Stage::Sandbox,
                    "no end reported past the Job's deadline".into(),
                ));
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
        }
    }
}

impl SandboxBackend for KubeBackend {
    async fn prepare(&self, task: &Task) -> Result<String, (Stage, String)> {
        if let Some(image) = &task.config.environment.docker_image {
            if let TaskImages::BuiltLocally(builder) = &self.options.images {
                return builder.image(task).await;
            }
            return Ok(image.clone());
        }
        match &self.options.images {
            TaskImages::BuiltLocally(builder) => builder.image(task).await,
            TaskImages::Registry(prefix) => Ok(format!(
                "{}/forgelog-task-{}:latest",
                prefix.trim_end_matches('/'),
                task.id
            )),
        }
    }

    async fn run(&self, a: Attempt<'_>) -> (AgentEnd, VerifierEnd) {
        match self.attempt(&a).await {
            Ok(ends) => ends,
            Err((stage, why)) => infra(stage, why),
        }
    }

    /// Deletes the run's lease: the garbage collector takes every object it owns.
    async fn clean_up(&self) {
        let leases: Api<ConfigMap> = self.api();
        let name = self.lease.owner.name.clone();
        let _ = retrying(|| leases.delete(&name, &BACKGROUND)).await;
    }
}
