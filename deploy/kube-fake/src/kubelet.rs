//! The fake kubelet (and Job controller): each Job gets one Pod, run as a
//! sandbox of the local podman backend — the pod's volumes as mounts, its
//! env (Secrets resolved), `forgelog-proxy` in its hosts pointing at a
//! relay to the proxy (a network namespace whose only route is that relay:
//! the run's NetworkPolicy, enforced), `activeDeadlineSeconds` as the
//! deadline — then the Pod's and the Job's status as a kubelet and the Job
//! controller write them, the termination message included. A Job deleted
//! meanwhile has its sandbox removed.

use crate::store::{Change, Store};
use forgelog_kube::termination::base64 as b64;
use forgelog_podman::{Exec, ExecEnd, Mount, Podman, SandboxNetwork, SandboxSpec};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The hostname pods reach the proxy by.
pub const PROXY_HOST: &str = "forgelog-proxy";

pub struct Kubelet {
    pub store: Arc<Store>,
    /// None: pods end at once, as a reference solution that scored 1.
    pub podman: Option<Podman>,
    /// The proxy as this host reaches it.
    pub proxy: SocketAddr,
    /// Cancels a Job's pod, by the Job's uid.
    running: Mutex<BTreeMap<String, tokio::sync::oneshot::Sender<()>>>,
}

/// What a pod needs from the store before it can start.
struct Prepared {
    env: Vec<(String, String)>,
    mounts: Vec<Mount>,
    script: String,
    image: String,
    _dir: tempfile::TempDir,
    termination: PathBuf,
}

impl Kubelet {
    pub fn new(store: Arc<Store>, podman: Option<Podman>, proxy: SocketAddr) -> Arc<Kubelet> {
        Arc::new(Kubelet {
            store,
            podman,
            proxy,
            running: Mutex::default(),
        })
    }

    /// Runs until `stop` is dropped or sent.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let (past, mut live) = self.store.watch(0);
        for c in past {
            self.clone().on(c);
        }
        loop {
            tokio::select! {
                _ = &mut stop => break,
                c = live.recv() => match c {
                    Ok(c) => self.clone().on(c),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                },
            }
        }
        // Stopping the kubelet stops its pods.
        let cancels: Vec<_> = std::mem::take(&mut *self.running.lock().expect("kubelet"))
            .into_values()
            .collect();
        drop(cancels);
    }

    fn on(self: Arc<Self>, c: Change) {
        if c.kind != "Job" {
            return;
        }
        let uid = c.object["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        match c.what {
            "ADDED" => {
                let (cancel, cancelled) = tokio::sync::oneshot::channel();
                self.running.lock().expect("kubelet").insert(uid, cancel);
                tokio::spawn(self.clone().pod(c.namespace, c.object, cancelled));
            }
            "DELETED" => {
                // Dropping the sender cancels the pod.
                self.running.lock().expect("kubelet").remove(&uid);
            }
            _ => {}
        }
    }

    fn prepare(&self, ns: &str, pod: &Value) -> Result<Prepared, String> {
        let spec = &pod["spec"];
        let c = &spec["containers"][0];
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut env = Vec::new();
        for e in c["env"].as_array().cloned().unwrap_or_default() {
            let name = e["name"].as_str().unwrap_or("").to_string();
            let value = match (&e["value"], &e["valueFrom"]["secretKeyRef"]) {
                (Value::String(v), _) => v.clone(),
                (_, r) if r.is_object() => {
                    let secret = self
                        .store
                        .get("Secret", ns, r["name"].as_str().unwrap_or(""))
                        .map_err(|e| format!("CreateContainerConfigError: {}", e.message))?;
                    let data = secret["data"][r["key"].as_str().unwrap_or("")]
                        .as_str()
                        .unwrap_or("");
                    String::from_utf8_lossy(&b64(data)).into_owned()
                }
                _ => String::new(),
            };
            env.push((name, value));
        }
        let mut volumes = BTreeMap::new();
        for v in spec["volumes"].as_array().cloned().unwrap_or_default() {
            let name = v["name"].as_str().unwrap_or("").to_string();
            let host = if let Some(cm) = v["configMap"]["name"].as_str() {
                let cm = self
                    .store
                    .get("ConfigMap", ns, cm)
                    .map_err(|e| format!("CreateContainerConfigError: {}", e.message))?;
                let at = dir.path().join(&name);
                std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
                for (k, data) in cm["binaryData"].as_object().cloned().unwrap_or_default() {
                    std::fs::write(at.join(k), b64(data.as_str().unwrap_or("")))
                        .map_err(|e| e.to_string())?;
                }
                for (k, data) in cm["data"].as_object().cloned().unwrap_or_default() {
                    std::fs::write(at.join(k), data.as_str().unwrap_or(""))
                        .map_err(|e| e.to_string())?;
                }
                at
            } else if let Some(p) = v["hostPath"]["path"].as_str() {
                PathBuf::from(p)
            } else {
                return Err(format!(
                    "volume {name}: only configMap and hostPath volumes run here"
                ));
            };
            volumes.insert(name, host);
        }
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
            let host = volumes
                .get(m["name"].as_str().unwrap_or(""))
                .ok_or_else(|| format!("no volume {}", m["name"]))?;
            mounts.push(Mount {
                host: host.clone(),
                target: m["mountPath"].as_str().unwrap_or("/").into(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
            });
        }
        let termination = dir.path().join("termination-log");
        std::fs::write(&termination, "").map_err(|e| e.to_string())?;
        mounts.push(Mount {
            host: termination.clone(),
            target: "/dev/termination-log".into(),
            read_only: false,
        });
        let command: Vec<String> = c["command"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        let script = match &command[..] {
            [bash, flag, script] if bash == "bash" && flag == "-c" => script.clone(),
            other => other.join(" "),
        };
        Ok(Prepared {
            env,
            mounts,
            script,
            image: c["image"].as_str().unwrap_or("").into(),
            _dir: dir,
            termination,
        })
    }

    fn set_pod(&self, ns: &str, name: &str, status: Value) {
        let _ = self.store.update("Pod", ns, name, |p| p["status"] = status);
    }

    fn set_job(&self, ns: &str, name: &str, condition: &str, reason: &str, ok: bool) {
        let _ = self.store.update("Job", ns, name, |j| {
            j["status"] = json!({
                "conditions": [{"type": condition, "status": "True", "reason": reason}],
                "succeeded": i32::from(ok), "failed": i32::from(!ok),
            })
        });
    }

    async fn pod(
        self: Arc<Self>,
        ns: String,
        job: Value,
        mut cancelled: tokio::sync::oneshot::Receiver<()>,
    ) {
        let job_name = job["metadata"]["name"].as_str().unwrap_or("").to_string();
        let template = &job["spec"]["template"];
        let name = format!("{job_name}-pod");
        let mut labels = template["metadata"]["labels"].clone();
        labels["job-name"] = json!(job_name);
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                "uid": job["metadata"]["uid"], "controller": true}]},
            "spec": template["spec"],
            "status": {"phase": "Pending"},
        });
        if self.store.create("Pod", &ns, pod.clone()).is_err() {
            return;
        }
        let Some(podman) = &self.podman else {
            // "MQo=" is "1\n": reward 1.
            let report =
                r#"{"agent":"exit:0","verifier":"exit:0","reward_json":"-","reward_txt":"MQo="}"#;
            self.set_pod(&ns, &name, json!({"phase": "Succeeded", "containerStatuses": [{
                "name": "attempt", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": report}}}]}));
            self.set_job(&ns, &job_name, "Complete", "Completed", true);
            return;
        };
        // Pending until what the pod needs is there (as a kubelet retries).
        let prepared = loop {
            match self.prepare(&ns, &pod) {
                Ok(p) => break p,
                Err(why) => {
                    self.set_pod(&ns, &name, json!({"phase": "Pending", "message": why}));
                    tokio::select! {
                        _ = &mut cancelled => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        };
        let deadline = job["spec"]["activeDeadlineSeconds"]
            .as_u64()
            .unwrap_or(3600);
        let network = match SandboxNetwork::create(self.proxy, 12000).await {
            Ok(n) => n,
            Err(e) => {
                self.set_pod(
                    &ns,
                    &name,
                    json!({"phase": "Pending", "message": e.to_string()}),
                );
                return;
            }
        };
        let spec = SandboxSpec {
            name: format!("forgelog-kube-{ns}-{name}"),
            labels: vec![("forgelog.kube/pod".into(), name.clone())],
            run_id: format!("kube-{ns}"),
            netns: Some(network.namespace.clone()),
            mounts: prepared.mounts.clone(),
            hosts: vec![(PROXY_HOST.into(), network.host_ip.to_string())],
            lifetime: Some(Duration::from_secs(deadline + 30)),
            ..Default::default()
        };
        let sandbox = match podman.start(&prepared.image, &spec).await {
            Ok(s) => s,
            Err(e) => {
                network.remove().await;
                let message = format!("ErrImagePull: {e}");
                self.set_pod(&ns, &name, json!({"phase": "Pending", "message": message}));
                return;
            }
        };
        self.set_pod(&ns, &name, json!({"phase": "Running"}));
        let ran = tokio::select! {
            r = sandbox.exec(&prepared.script, "/", &prepared.env, Duration::from_secs(deadline)) => Some(r),
            _ = &mut cancelled => None,
        };
        let _ = sandbox.remove().await;
        network.remove().await;
        let Some(ran) = ran else { return };
        let message = std::fs::read_to_string(&prepared.termination).unwrap_or_default();
        let (code, reason, ok) = match ran {
            Ok(Exec {
                end: ExecEnd::Exited(Some(0)),
                ..
            }) => (0, "Completed", true),
            Ok(Exec {
                end: ExecEnd::Exited(code),
                ..
            }) => (code.unwrap_or(137), "Error", false),
            Ok(Exec {
                end: ExecEnd::TimedOut,
                ..
            }) => (137, "DeadlineExceeded", false),
            Err(_) => (128, "ContainerCannotRun", false),
        };
        self.set_pod(&ns, &name, json!({
            "phase": if ok { "Succeeded" } else { "Failed" },
            "containerStatuses": [{"name": "attempt", "ready": false, "restartCount": 0,
                "image": prepared.image, "imageID": "",
                "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}],
        }));
        match reason {
            "Completed" => self.set_job(&ns, &job_name, "Complete", "Completed", true),
            "DeadlineExceeded" => self.set_job(&ns, &job_name, "Failed", "DeadlineExceeded", false),
            _ => self.set_job(&ns, &job_name, "Failed", "BackoffLimitExceeded", false),
        }
    }
}
