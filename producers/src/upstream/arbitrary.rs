//! Arbitrary JSON for the property tests of the upstream's text handling:
//! strings full of JSON's own punctuation, escapes and control characters,
//! keys with quotes and backslashes, numbers exact in decimal.

use proptest::prelude::*;
use serde_json::Value;

pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        // Exact in decimal, so that reading one back gives the same number.
        (any::<i16>(), 0..4i32).prop_map(|(m, e)| Value::from(f64::from(m) / 2f64.powi(e))),
        "\\PC{0,8}".prop_map(Value::from),
        "[\\[\\]{}\"\\\\,:a-z ]{0,8}".prop_map(Value::from),
        "[\"\\\\\n\t\u{1}a-z]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z\"\\\\]{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
