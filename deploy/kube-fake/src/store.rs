//! The fake API server's object store: JSON objects by kind, namespace and
//! name, one resourceVersion counter, every change kept as a watch event,
//! and deletes that cascade to dependents through ownerReferences (what the
//! garbage collector does).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::broadcast;

/// A change, as a watch stream sends it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub kind: String,
    pub namespace: String,
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub what: &'static str,
    pub object: Value,
}

/// A refusal, as the API server's `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

type Key = (String, String, String);

#[derive(Default)]
struct Objects {
    rv: u64,
    uid: u64,
    by_key: BTreeMap<Key, Value>,
    history: Vec<Change>,
}

pub struct Store {
    objects: Mutex<Objects>,
    changes: broadcast::Sender<Change>,
}

impl Default for Store {
    fn default() -> Store {
        Store {
            objects: Mutex::default(),
            changes: broadcast::channel(4096).0,
        }
    }
}

/// Whether `labels` match an equality selector `a=b,c!=d`.
pub fn matches(selector: Option<&str>, labels: &Value) -> bool {
    selector
        .unwrap_or("")
        .split(',')
        .filter(|t| !t.trim().is_empty())
        .all(|term| {
            let (key, want, equal) = match term.split_once("!=") {
                Some((k, v)) => (k, v, false),
                None => match term.split_once("==").or_else(|| term.split_once('=')) {
                    Some((k, v)) => (k, v, true),
                    None => return labels.get(term.trim()).is_some(),
                },
            };
            (labels.get(key.trim()).and_then(Value::as_str) == Some(want.trim())) == equal
        })
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

impl Store {
    fn record(&self, o: &mut Objects, kind: &str, ns: &str, what: &'static str, object: &Value) {
        let change = Change {
            rv: o.rv,
            kind: kind.into(),
            namespace: ns.into(),
            what,
            object: object.clone(),
        };
        o.history.push(change.clone());
        let _ = self.changes.send(change);
    }

    fn bump(o: &mut Objects, object: &mut Value) {
        o.rv += 1;
        object["metadata"]["resourceVersion"] = json!(o.rv.to_string());
    }

    pub fn create(&self, kind: &str, ns: &str, mut object: Value) -> Result<Value, Refusal> {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            return Err(Refusal {
                code: 422,
                reason: "Invalid",
                message: format!("{kind}: metadata.name: Required value"),
            });
        }
        let mut o = self.objects.lock().expect("store");
        let key = (kind.to_string(), ns.to_string(), name.clone());
        if o.by_key.contains_key(&key) {
            return Err(Refusal {
                code: 409,
                reason: "AlreadyExists",
                message: format!("{kind} \"{name}\" already exists"),
            });
        }
        o.uid += 1;
        object["metadata"]["uid"] = json!(format!("uid-{}", o.uid));
        object["metadata"]["namespace"] = json!(ns);
        object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        Store::bump(&mut o, &mut object);
        self.record(&mut o, kind, ns, "ADDED", &object);
        o.by_key.insert(key, object.clone());
        Ok(object)
    }

    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Result<Value, Refusal> {
        let o = self.objects.lock().expect("store");
        o.by_key
            .get(&(kind.into(), ns.into(), name.into()))
            .cloned()
            .ok_or_else(|| not_found(kind, name))
    }

    /// Matching objects and the resourceVersion they are as of.
    pub fn list(&self, kind: &str, ns: &str, selector: Option<&str>) -> (Vec<Value>, u64) {
        let o = self.objects.lock().expect("store");
        let items = o
            .by_key
            .iter()
            .filter(|((k, n, _), v)| {
                k == kind && n == ns && matches(selector, &v["metadata"]["labels"])
            })
            .map(|(_, v)| v.clone())
            .collect();
        (items, o.rv)
    }

    /// Changes after `rv` still kept, then every later one.
    pub fn watch(&self, rv: u64) -> (Vec<Change>, broadcast::Receiver<Change>) {
        let o = self.objects.lock().expect("store");
        let past = o.history.iter().filter(|c| c.rv > rv).cloned().collect();
        (past, self.changes.subscribe())
    }

    /// Changes `name` with `f` (a whole replace, a patch, a status update).
    pub fn update(
        &self,
        kind: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, Refusal> {
        let mut o = self.objects.lock().expect("store");
        let key = (kind.to_string(), ns.to_string(), name.to_string());
        let mut object = o
            .by_key
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(kind, name))?;
        let (uid, created) = (
            object["metadata"]["uid"].clone(),
            object["metadata"]["creationTimestamp"].clone(),
        );
        f(&mut object);
        object["metadata"]["uid"] = uid;
        object["metadata"]["creationTimestamp"] = created;
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!(ns);
        Store::bump(&mut o, &mut object);
        self.record(&mut o, kind, ns, "MODIFIED", &object);
        o.by_key.insert(key, object.clone());
        Ok(object)
    }

    /// Deletes `name` and, as the garbage collector would, everything it owns.
    pub fn delete(&self, kind: &str, ns: &str, name: &str) -> Result<Value, Refusal> {
        let mut o = self.objects.lock().expect("store");
        let key = (kind.to_string(), ns.to_string(), name.to_string());
        let object = o
            .by_key
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(kind, name))?;
        let mut doomed = vec![key];
        let mut i = 0;
        while i < doomed.len() {
            let uid = o.by_key[&doomed[i]]["metadata"]["uid"].clone();
            let owned: Vec<Key> = o
                .by_key
                .iter()
                .filter(|(k, v)| {
                    !doomed.contains(k)
                        && v["metadata"]["ownerReferences"]
                            .as_array()
                            .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
                })
                .map(|(k, _)| k.clone())
                .collect();
            doomed.extend(owned);
            i += 1;
        }
        for k in doomed {
            if let Some(mut v) = o.by_key.remove(&k) {
                Store::bump(&mut o, &mut v);
                self.record(&mut o, &k.0, &k.1, "DELETED", &v);
            }
        }
        Ok(object)
    }

    /// How many objects of `kind` there are in all namespaces.
    pub fn count(&self, kind: &str) -> usize {
        let o = self.objects.lock().expect("store");
        o.by_key.keys().filter(|(k, _, _)| k == kind).count()
    }
}

fn not_found(kind: &str, name: &str) -> Refusal {
    Refusal {
        code: 404,
        reason: "NotFound",
        message: format!("{kind} \"{name}\" not found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_cascade_through_owners_and_selectors_match_labels() {
        let s = Store::default();
        let lease = s
            .create("ConfigMap", "ns", json!({"metadata": {"name": "lease"}}))
            .unwrap();
        let uid = lease["metadata"]["uid"].clone();
        let owned = |name: &str, owner: &Value| json!({"metadata": {"name": name, "labels": {"run": "r"}, "ownerReferences": [{"uid": owner}]}});
        let job = s.create("Job", "ns", owned("job", &uid)).unwrap();
        s.create("Pod", "ns", owned("pod", &job["metadata"]["uid"]))
            .unwrap();
        s.create("Pod", "ns", json!({"metadata": {"name": "other"}}))
            .unwrap();
        assert_eq!(
            s.create("Job", "ns", owned("job", &uid)).unwrap_err().code,
            409
        );
        assert_eq!(s.list("Pod", "ns", Some("run=r")).0.len(), 1);
        assert_eq!(s.list("Pod", "ns", Some("run!=r")).0.len(), 1);
        s.delete("ConfigMap", "ns", "lease").unwrap();
        assert_eq!((s.count("Job"), s.count("Pod")), (0, 1));
        let (past, _) = s.watch(0);
        let deleted: Vec<&str> = past
            .iter()
            .filter(|c| c.what == "DELETED")
            .map(|c| c.kind.as_str())
            .collect();
        assert_eq!(deleted, ["ConfigMap", "Job", "Pod"]);
        let mut v = json!({"a": {"b": 1, "c": 2}});
        merge_patch(&mut v, &json!({"a": {"b": null, "d": 3}}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}}));
    }
}
