//! Proto3 JSON's two spellings of a field name: lowerCamelCase, which the
//! Gemini dialect reads, and the proto name (`parameters_json_schema`).

use serde_json::Value;
use std::borrow::Cow;

/// Values whose keys are the client's own (a call's arguments, a function's
/// response, schemas, labels): never renamed.
const FREE_FORM: &[&str] = &[
    "args",
    "response",
    "parameters",
    "parametersJsonSchema",
    "responseSchema",
    "responseJsonSchema",
    "labels",
];

/// The request with every field named in lowerCamelCase, as this dialect
/// reads them. Proto3 JSON lets a client spell a field by its proto name
/// instead (`parameters_json_schema`: Google ADK does), and Gemini takes
/// either; free-form values keep their keys. Borrowed when nothing needs it.
pub(super) fn lower_camel_fields(v: &Value) -> Cow<'_, Value> {
    fn snake_anywhere(v: &Value) -> bool {
        match v {
            Value::Object(o) => o.iter().any(|(k, v)| {
                k.contains('_') || (!FREE_FORM.contains(&k.as_str()) && snake_anywhere(v))
            }),
            Value::Array(a) => a.iter().any(snake_anywhere),
            _ => false,
        }
    }
    fn renamed(v: &Value) -> Value {
        match v {
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| {
                        let k = lower_camel(k);
                        let v = if FREE_FORM.contains(&k.as_str()) {
                            v.clone()
                        } else {
                            renamed(v)
                        };
                        (k, v)
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(renamed).collect()),
            other => other.clone(),
        }
    }
    if snake_anywhere(v) {
        Cow::Owned(renamed(v))
    } else {
        Cow::Borrowed(v)
    }
}

/// `parameters_json_schema` as `parametersJsonSchema`.
fn lower_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' if !out.is_empty() => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proto_names_become_lower_camel_and_the_clients_keys_stay() {
        assert_eq!(
            lower_camel("parameters_json_schema"),
            "parametersJsonSchema"
        );
        assert_eq!(lower_camel("text"), "text");
        assert_eq!(lower_camel("_private"), "_private");
        // A camelCase request whose only snake_case keys are the client's own
        // is read as it is, not copied.
        let camel = json!({"contents": [{"parts": [{"functionCall": {"name": "f", "args": {"file_path": "a"}}}]}]});
        assert!(matches!(lower_camel_fields(&camel), Cow::Borrowed(_)));
        let proto = json!({"contents": [{"parts": [{"function_call": {"name": "f", "args": {"file_path": "a"}}}]}]});
        assert_eq!(*lower_camel_fields(&proto), camel);
    }
}
