//! The objects of one attempt, built from plain values: its Job (one pod,
//! never restarted, a server-side deadline, cleaned up after it ends), the
//! Secret holding its session key, and the ConfigMap of its task's files.

use crate::names::{self, label_value, object_name};
use crate::termination::RUNNER;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, ImageVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    Secret, SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use std::collections::BTreeMap;

/// Where the harness bundles are in the pod.
pub const BUNDLES: &str = "/opt/forgelog/bundles";
const TASK_FILES: &str = "/forgelog/task";

/// How the harness bundles reach a pod (always read-only).
#[derive(Debug, Clone, PartialEq)]
pub enum BundleSource {
    /// An OCI image holding the bundles at its root, as an image volume
    /// (Kubernetes 1.33+).
    Image(String),
    /// The same image, for clusters without image volumes: an init
    /// container copies its `/bundles` into an emptyDir.
    CopiedFrom(String),
    /// A directory on every node (single-node and development clusters,
    /// the fake kubelet).
    HostPath(String),
}

impl std::str::FromStr for BundleSource {
    type Err = String;

    /// `image:REF`, `copy:REF` or `hostpath:DIR`.
    fn from_str(s: &str) -> Result<BundleSource, String> {
        match s.split_once(':') {
            Some(("image", r)) if !r.is_empty() => Ok(BundleSource::Image(r.into())),
            Some(("copy", r)) if !r.is_empty() => Ok(BundleSource::CopiedFrom(r.into())),
            Some(("hostpath", d)) if !d.is_empty() => Ok(BundleSource::HostPath(d.into())),
            _ => Err(format!(
                "{s:?}: harness bundles come from image:REF, copy:REF or hostpath:DIR"
            )),
        }
    }
}

/// Everything an attempt's objects are made from.
#[derive(Debug, Clone)]
pub struct AttemptObjects<'a> {
    pub namespace: &'a str,
    pub run_id: &'a str,
    pub rollout_id: &'a str,
    pub attempt_id: &'a str,
    pub task_id: &'a str,
    pub harness: &'a str,
    pub image: &'a str,
    /// The proxy as pods reach it (its Service).
    pub proxy_url: &'a str,
    pub api_key: &'a str,
    pub bundles: &'a BundleSource,
    /// `solve`: run the task's reference solution instead of a launch script.
    pub solve: bool,
    pub agent_timeout_sec: f64,
    pub verifier_timeout_sec: f64,
    /// Added to the timeouts for `activeDeadlineSeconds`: pod start, copies.
    pub slack_sec: u64,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    /// The run's lease: owner of every object of the run.
    pub owner: &'a OwnerReference,
}

fn meta(name: String, a: &AttemptObjects<'_>, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(a.namespace.to_string()),
        labels: Some(labels),
        owner_references: Some(vec![a.owner.clone()]),
        ..Default::default()
    }
}

/// The name of the ConfigMap with a task's files for a harness.
pub fn files_name(run: &str, task: &str, harness: &str) -> String {
    object_name("forgelog-files", &format!("{run}-{task}-{harness}"))
}

/// The ConfigMap of a task's files as the runner reads them: the
/// instruction, the launch script (or the reference solution) and `tests/`
/// as a tar (ConfigMap keys cannot hold directories).
pub fn task_files(
    name: &str,
    namespace: &str,
    labels: BTreeMap<String, String>,
    owner: &OwnerReference,
    files: BTreeMap<String, Vec<u8>>,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        binary_data: Some(files.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    }
}

impl AttemptObjects<'_> {
    pub fn job_name(&self) -> String {
        object_name("forgelog", self.attempt_id)
    }

    pub fn secret_name(&self) -> String {
        object_name("forgelog-key", self.attempt_id)
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut l = names::run_labels(self.run_id);
        for (k, v) in [
            (names::ROLLOUT, self.rollout_id),
            (names::ATTEMPT, self.attempt_id),
            (names::TASK, self.task_id),
            (names::HARNESS, self.harness),
        ] {
            l.insert(k.to_string(), label_value(v));
        }
        l
    }

    /// `activeDeadlineSeconds`: the server kills the attempt after this,
    /// whatever became of its orchestrator.
    pub fn deadline_sec(&self) -> i64 {
        (self.agent_timeout_sec + self.verifier_timeout_sec).ceil() as i64 + self.slack_sec as i64
    }

    /// The session key, never in the Job's spec in clear text.
    pub fn secret(&self) -> Secret {
        Secret {
            metadata: meta(self.secret_name(), self, self.labels()),
            data: Some(BTreeMap::from([(
                "api_key".to_string(),
                ByteString(self.api_key.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    pub fn job(&self) -> Job {
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: Some(true),
            ..Default::default()
        };
        let mut limits = BTreeMap::new();
        if let Some(c) = self.cpus {
            limits.insert("cpu".to_string(), Quantity(format!("{c}")));
        }
        if let Some(m) = self.memory_mb {
            limits.insert("memory".to_string(), Quantity(format!("{m}Mi")));
        }
        let files = Volume {
            name: "task".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: files_name(self.run_id, self.task_id, self.harness),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (bundles, init) = bundles_volume(self.bundles);
        let labels = self.labels();
        Job {
            metadata: meta(self.job_name(), self, labels.clone()),
            spec: Some(JobSpec {
                backoff_limit: Some(0),
                active_deadline_seconds: Some(self.deadline_sec()),
                ttl_seconds_after_finished: Some(600),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        restart_policy: Some("Never".into()),
                        automount_service_account_token: Some(false),
                        enable_service_links: Some(false),
                        init_containers: init.map(|c| vec![c]),
                        containers: vec![Container {
                            name: "attempt".into(),
                            image: Some(self.image.to_string()),
                            command: Some(vec!["bash".into(), "-c".into(), RUNNER.into()]),
                            env: Some(self.env()),
                            volume_mounts: Some(vec![
                                mount("task", TASK_FILES),
                                mount("bundles", BUNDLES),
                            ]),
                            resources: (!limits.is_empty()).then(|| ResourceRequirements {
                                limits: Some(limits),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        volumes: Some(vec![files, bundles]),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The runner's environment: where the proxy, the bundles, the task's
    /// files and the logs are, the launch, the timeouts, and the session's
    /// key from its Secret (never in the Job itself).
    fn env(&self) -> Vec<EnvVar> {
        let env = |name: &str, value: String| EnvVar {
            name: name.into(),
            value: Some(value),
            ..Default::default()
        };
        vec![
            env("HOME", "/tmp/forgelog-home".into()),
            env(
                "FORGELOG_BASE_URL",
                self.proxy_url.trim_end_matches('/').into(),
            ),
            env("FORGELOG_BUNDLES", BUNDLES.into()),
            env(
                "PATH",
                format!("{BUNDLES}/node/bin:/usr/local/bin:/usr/bin:/bin"),
            ),
            env(
                "FORGELOG_INSTRUCTION",
                format!("{TASK_FILES}/instruction.md"),
            ),
            env("FORGELOG_AGENT_LOGS", "/logs/agent".into()),
            env(
                "FORGELOG_LAUNCH",
                if self.solve { "solve" } else { "script" }.into(),
            ),
            env(
                "FORGELOG_AGENT_TIMEOUT",
                (self.agent_timeout_sec.ceil() as u64).max(1).to_string(),
            ),
            env(
                "FORGELOG_VERIFIER_TIMEOUT",
                (self.verifier_timeout_sec.ceil() as u64).max(1).to_string(),
            ),
            EnvVar {
                name: "FORGELOG_API_KEY".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: self.secret_name(),
                        key: "api_key".into(),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]
    }
}

/// The harness bundles' volume, and the init container that fills it when
/// they are copied out of an image.
fn bundles_volume(source: &BundleSource) -> (Volume, Option<Container>) {
    match source {
        BundleSource::Image(image) => (
            Volume {
                name: "bundles".into(),
                image: Some(ImageVolumeSource {
                    reference: Some(image.clone()),
                    pull_policy: Some("IfNotPresent".into()),
                }),
                ..Default::default()
            },
            None,
        ),
        BundleSource::CopiedFrom(image) => (
            Volume {
                name: "bundles".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Some(Container {
                name: "bundles".into(),
                image: Some(image.clone()),
                command: Some(vec![
                    "cp".into(),
                    "-a".into(),
                    "/bundles/.".into(),
                    format!("{BUNDLES}/"),
                ]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "bundles".into(),
                    mount_path: BUNDLES.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        ),
        BundleSource::HostPath(dir) => (
            Volume {
                name: "bundles".into(),
                host_path: Some(HostPathVolumeSource {
                    path: dir.clone(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            },
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_source_is_named_by_its_kind() {
        let parsed: Vec<BundleSource> = ["image:reg/b:1", "copy:reg/b:1", "hostpath:/opt/b"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            parsed,
            [
                BundleSource::Image("reg/b:1".into()),
                BundleSource::CopiedFrom("reg/b:1".into()),
                BundleSource::HostPath("/opt/b".into()),
            ]
        );
        for bad in ["reg/b:1", "image:", "volume:x", ""] {
            assert!(bad.parse::<BundleSource>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_job_runs_once_within_its_deadline_owned_by_the_run_with_its_key_in_a_secret() {
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "forgelog-run-r".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        let bundles = BundleSource::HostPath("/srv/bundles".into());
        let a = AttemptObjects {
            namespace: "ns",
            run_id: "r",
            rollout_id: "r-t-h-0",
            attempt_id: "r-t-h-0~1",
            task_id: "t",
            harness: "h",
            image: "localhost/forgelog-task-t",
            proxy_url: "http://forgelog-proxy:8100/",
            api_key: "fl-secret",
            bundles: &bundles,
            solve: false,
            agent_timeout_sec: 300.0,
            verifier_timeout_sec: 60.5,
            slack_sec: 120,
            cpus: Some(1.0),
            memory_mb: Some(512),
            owner: &owner,
        };
        let job = a.job();
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(481));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(job.metadata.owner_references, Some(vec![owner.clone()]));
        let text = serde_json::to_string(&job).unwrap();
        assert!(!text.contains("fl-secret"), "the key is not in the Job");
        assert!(text.contains("forgelog-key-"));
        let labels = job.metadata.labels.unwrap();
        assert_eq!(labels[names::RUN], "r");
        assert!(labels[names::ATTEMPT].len() <= 63);
        assert_ne!(a.job_name(), object_name("forgelog", "r-t-h-0"));
        let env = pod.containers[0].env.as_ref().unwrap();
        let url = env.iter().find(|e| e.name == "FORGELOG_BASE_URL").unwrap();
        assert_eq!(url.value.as_deref(), Some("http://forgelog-proxy:8100"));
        assert_eq!(
            a.secret().data.unwrap()["api_key"],
            ByteString(b"fl-secret".to_vec())
        );
    }
}
