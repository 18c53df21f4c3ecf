//! Every manifest in `deploy/k8s/` parsed with the `k8s-openapi` types and
//! written back: a field the type does not know (a typo) would not survive
//! the round trip, so it fails here rather than on a cluster. Strimzi's
//! resources (no types in k8s-openapi) are checked for the fields forgelog
//! relies on; kustomizations for files that exist.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            out.push(p);
        }
    }
}

/// Whether everything in `doc` is in `back` as it was (the types add
/// `apiVersion` and `kind` to embedded objects: that is no loss).
fn kept(back: &Value, doc: &Value) -> Result<(), String> {
    match (back, doc) {
        (Value::Object(b), Value::Object(d)) => d.iter().try_for_each(|(k, v)| match b.get(k) {
            Some(bv) => kept(bv, v).map_err(|e| format!("{k}.{e}")),
            None => Err(format!("{k}: dropped (not a field of the type)")),
        }),
        (Value::Array(b), Value::Array(d)) if b.len() == d.len() => b
            .iter()
            .zip(d)
            .enumerate()
            .try_for_each(|(i, (bv, v))| kept(bv, v).map_err(|e| format!("[{i}].{e}"))),
        (b, d) if b == d => Ok(()),
        (b, d) => Err(format!(" became {b} (was {d})")),
    }
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value, what: &str) {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    if let Err(e) = kept(&back, doc) {
        panic!("{what}: {e}");
    }
}

#[test]
fn every_manifest_parses_with_the_kubernetes_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s");
    let mut files = Vec::new();
    yaml_files(&root, &mut files);
    files.sort();
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let doc: Value =
                serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            let what = format!("{name} #{i}");
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: no kind"));
            *kinds.entry(kind.to_string()).or_default() += 1;
            if name.starts_with("overlays/") && kind != "Kustomization" {
                // A patch: a partial object, named like one in the base.
                assert!(doc["metadata"]["name"].is_string(), "{what}");
                continue;
            }
            match kind {
                "Namespace" => round_trip::<Namespace>(&doc, &what),
                "Secret" => round_trip::<Secret>(&doc, &what),
                "Service" => round_trip::<Service>(&doc, &what),
                "ServiceAccount" => round_trip::<ServiceAccount>(&doc, &what),
                "Deployment" => round_trip::<Deployment>(&doc, &what),
                "StatefulSet" => round_trip::<StatefulSet>(&doc, &what),
                "Job" => round_trip::<Job>(&doc, &what),
                "Role" => round_trip::<Role>(&doc, &what),
                "RoleBinding" => round_trip::<RoleBinding>(&doc, &what),
                "Kafka" => {
                    assert_eq!(doc["apiVersion"], "kafka.strimzi.io/v1beta2", "{what}");
                    assert!(doc["spec"]["kafka"]["listeners"].is_array(), "{what}");
                }
                "KafkaNodePool" => assert!(doc["spec"]["replicas"].is_u64(), "{what}"),
                "KafkaTopic" => {
                    assert_eq!(
                        doc["metadata"]["labels"]["strimzi.io/cluster"], "forgelog-kafka",
                        "{what}"
                    );
                    assert!(doc["spec"]["partitions"].is_u64(), "{what}");
                    assert_eq!(
                        doc["spec"]["config"]["retention.ms"], -1,
                        "{what}: the log is kept"
                    );
                }
                "Kustomization" => {
                    let dir = file.parent().unwrap();
                    let listed = doc["resources"].as_array().cloned().unwrap_or_default();
                    let patches = doc["patches"].as_array().cloned().unwrap_or_default();
                    for r in listed.iter().filter_map(Value::as_str) {
                        assert!(dir.join(r).exists(), "{what}: {r} does not exist");
                    }
                    for p in patches.iter().filter_map(|p| p["path"].as_str()) {
                        assert!(dir.join(p).exists(), "{what}: patch {p} does not exist");
                    }
                }
                other => panic!("{what}: no check for kind {other}"),
            }
        }
    }
    // Every topic the log has is declared.
    assert_eq!(kinds.get("KafkaTopic"), Some(&6), "{kinds:?}");
    for kind in ["StatefulSet", "Deployment", "Role", "Kafka", "Job"] {
        assert!(kinds.contains_key(kind), "{kind} missing: {kinds:?}");
    }
}

#[test]
fn a_typo_in_a_manifest_fails_the_round_trip() {
    let doc = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"}, "spec": {"selectr": {"a": "b"}}});
    let typed: Service = serde_json::from_value(doc.clone()).unwrap();
    let err = kept(&serde_json::to_value(&typed).unwrap(), &doc).unwrap_err();
    assert!(err.contains("selectr: dropped"), "{err}");
}
