//! The Avro binary encoding of a datum (the specification's "Binary
//! Encoding"), written straight from the `Value` serde builds for an event.
//!
//! `apache_avro::to_avro_datum` resolves the schema's named types and
//! validates the value against it on every call; for the proxy's events that
//! was most of their encoding cost. The names are resolved once per schema
//! here ([`Names::of`]), and the value is taken as serde shaped it: unions
//! already carry their branch. A map's entries are written by key, where
//! `apache_avro` writes them in its `HashMap`'s order, different each run.
//! `tests/codec.rs` checks every event kind against `apache_avro`'s writer.

use apache_avro::schema::{Name, Namespace, RecordSchema, Schema, UnionSchema};
use apache_avro::types::Value;
use std::collections::HashMap;

/// The named types (records, enums, fixed) a schema defines, by full name.
#[derive(Debug, Clone)]
pub(crate) struct Names(HashMap<Name, Schema>);

impl Names {
    pub(crate) fn of(schema: &Schema) -> Result<Names, apache_avro::Error> {
        let resolved = apache_avro::schema::ResolvedSchema::try_from(schema)?;
        Ok(Names(
            resolved
                .get_names()
                .iter()
                .map(|(name, schema)| (name.clone(), (*schema).clone()))
                .collect(),
        ))
    }
}

/// Why a value could not be written as its schema.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DatumError(String);

/// Appends `value`, encoded as `schema`, to `out`.
pub(crate) fn write(
    value: &Value,
    schema: &Schema,
    names: &Names,
    out: &mut Vec<u8>,
) -> Result<(), DatumError> {
    Writer { names, out }.value(value, schema, &None)
}

struct Writer<'a> {
    names: &'a Names,
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn value(&mut self, value: &Value, schema: &Schema, ns: &Namespace) -> Result<(), DatumError> {
        if let Schema::Ref { name } = schema {
            let full = name.fully_qualified_name(ns);
            let named = self.names.0.get(&full).ok_or_else(|| {
                DatumError(format!(
                    "{} is not a type of this schema",
                    full.fullname(None)
                ))
            })?;
            return self.value(value, named, ns);
        }
        match (value, schema) {
            (_, Schema::Union(union)) => self.union(value, union, schema, ns),
            (Value::Union(..), _) => Err(mismatch(value, schema)),
            (Value::Array(items), Schema::Array(array)) => {
                if !items.is_empty() {
                    self.long(items.len() as i64);
                    for item in items {
                        self.value(item, &array.items, ns)?;
                    }
                }
                self.out.push(0);
                Ok(())
            }
            (Value::Map(entries), Schema::Map(map)) => {
                if !entries.is_empty() {
                    self.long(entries.len() as i64);
                    // By key: `Value::Map` is a HashMap, and the same event
                    // must always be the same bytes.
                    let mut entries: Vec<_> = entries.iter().collect();
                    entries.sort_unstable_by_key(|(key, _)| *key);
                    for (key, item) in entries {
                        self.bytes(key.as_bytes());
                        self.value(item, &map.types, ns)?;
                    }
                }
                self.out.push(0);
                Ok(())
            }
            (Value::Record(fields), Schema::Record(record)) => self.record(fields, record, ns),
            _ => self.scalar(value, schema),
        }
    }

    /// A value of a union (`schema`): its branch index, then the value.
    fn union(
        &mut self,
        value: &Value,
        union: &UnionSchema,
        schema: &Schema,
        ns: &Namespace,
    ) -> Result<(), DatumError> {
        match value {
            Value::Union(branch, inner) => {
                let variant = union.variants().get(*branch as usize).ok_or_else(|| {
                    DatumError(format!(
                        "union branch {branch} of {}",
                        union.variants().len()
                    ))
                })?;
                self.long(i64::from(*branch));
                self.value(inner, variant, ns)
            }
            // serde writes `None` as the union's null branch; a plain null in a
            // union is that branch too.
            Value::Null => {
                let branch = union
                    .variants()
                    .iter()
                    .position(|s| *s == Schema::Null)
                    .ok_or_else(|| mismatch(value, schema))?;
                self.long(branch as i64);
                Ok(())
            }
            _ => {
                // Any other value in a union: its first branch that takes it.
                let start = self.out.len();
                for (branch, variant) in union.variants().iter().enumerate() {
                    self.long(branch as i64);
                    if self.value(value, variant, ns).is_ok() {
                        return Ok(());
                    }
                    self.out.truncate(start);
                }
                Err(mismatch(value, schema))
            }
        }
    }

    /// A value with no values inside: a primitive, a fixed, an enum symbol.
    fn scalar(&mut self, value: &Value, schema: &Schema) -> Result<(), DatumError> {
        match (value, schema) {
            (Value::Null, Schema::Null) => Ok(()),
            (Value::Boolean(b), Schema::Boolean) => {
                self.out.push(u8::from(*b));
                Ok(())
            }
            (Value::Int(n), Schema::Int | Schema::Long | Schema::Date | Schema::TimeMillis)
            | (
                Value::Date(n) | Value::TimeMillis(n),
                Schema::Int | Schema::Date | Schema::TimeMillis,
            ) => {
                self.long(i64::from(*n));
                Ok(())
            }
            (
                Value::Long(n) | Value::TimestampMillis(n) | Value::TimestampMicros(n),
                Schema::Long | Schema::TimestampMillis | Schema::TimestampMicros,
            ) => {
                self.long(*n);
                Ok(())
            }
            (Value::Float(x), Schema::Float) => {
                self.out.extend_from_slice(&x.to_le_bytes());
                Ok(())
            }
            (Value::Double(x), Schema::Double) => {
                self.out.extend_from_slice(&x.to_le_bytes());
                Ok(())
            }
            (Value::Bytes(b), Schema::Bytes) => {
                self.bytes(b);
                Ok(())
            }
            (Value::String(s), Schema::String) => {
                self.bytes(s.as_bytes());
                Ok(())
            }
            (Value::Bytes(b) | Value::Fixed(_, b), Schema::Fixed(fixed))
                if b.len() == fixed.size =>
            {
                self.out.extend_from_slice(b);
                Ok(())
            }
            (Value::String(symbol), Schema::Enum(e)) => {
                let index = e.symbols.iter().position(|s| s == symbol).ok_or_else(|| {
                    DatumError(format!(
                        "{symbol:?} is not a symbol of {}",
                        e.name.fullname(None)
                    ))
                })?;
                self.long(index as i64);
                Ok(())
            }
            (Value::Enum(index, _), Schema::Enum(e)) if (*index as usize) < e.symbols.len() => {
                self.long(i64::from(*index));
                Ok(())
            }
            _ => Err(mismatch(value, schema)),
        }
    }

    /// The fields in the schema's order, found by name (serde writes them in
    /// declaration order, the schema's, so the lookup is one comparison).
    fn record(
        &mut self,
        fields: &[(String, Value)],
        record: &RecordSchema,
        ns: &Namespace,
    ) -> Result<(), DatumError> {
        let ns = record.name.fully_qualified_name(ns).namespace;
        for (i, field) in record.fields.iter().enumerate() {
            let value = match fields.get(i) {
                Some((name, value)) if *name == field.name => value,
                _ => fields
                    .iter()
                    .find(|(name, _)| *name == field.name)
                    .map(|(_, value)| value)
                    .ok_or_else(|| {
                        DatumError(format!(
                            "{} has no field {}",
                            record.name.fullname(None),
                            field.name
                        ))
                    })?,
            };
            self.value(value, &field.schema, &ns)
                .map_err(|e| DatumError(format!("{}: {}", field.name, e.0)))?;
        }
        Ok(())
    }

    /// A long (and an int): zig-zag, then 7 bits a byte, low first.
    fn long(&mut self, n: i64) {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            self.out.push((z as u8) | 0x80);
            z >>= 7;
        }
        self.out.push(z as u8);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.long(b.len() as i64);
        self.out.extend_from_slice(b);
    }
}

/// The long [`Writer::long`] writes, read from the start of `bytes`, and how
/// many bytes it took; `None` if they end first or it runs past 10 bytes.
pub(crate) fn read_long(bytes: &[u8]) -> Option<(i64, usize)> {
    let mut z = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        z |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(((z >> 1) as i64 ^ -((z & 1) as i64), i + 1));
        }
    }
    None
}

fn mismatch(value: &Value, schema: &Schema) -> DatumError {
    let shown = format!("{value:?}");
    let shown = match shown.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &shown[..cut]),
        None => shown,
    };
    DatumError(format!(
        "{shown} is not a {:?}",
        apache_avro::schema::SchemaKind::from(schema)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: Value, schema: &str) -> Vec<u8> {
        let schema = Schema::parse_str(schema).unwrap();
        let mut out = Vec::new();
        write(&value, &schema, &Names::of(&schema).unwrap(), &mut out).unwrap();
        assert_eq!(out, apache_avro::to_avro_datum(&schema, value).unwrap());
        out
    }

    /// The specification's own examples, and the edges of the varint.
    #[test]
    fn longs_strings_arrays_and_unions_as_the_specification_writes_them() {
        for (n, bytes) in [
            (0i64, vec![0x00]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (-2, vec![0x03]),
            (2, vec![0x04]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
        ] {
            assert_eq!(encoded(Value::Long(n), r#""long""#), bytes, "{n}");
            assert_eq!(read_long(&bytes), Some((n, bytes.len())), "{n}");
        }
        for n in [i64::MIN, i64::MAX, 1 << 40] {
            let bytes = encoded(Value::Long(n), r#""long""#);
            assert_eq!(read_long(&bytes), Some((n, bytes.len())), "{n}");
        }
        // Cut short, or past a long's 10 bytes: not a long.
        assert_eq!(read_long(&[0x80, 0x80]), None);
        assert_eq!(read_long(&[0xff; 11]), None);
        assert_eq!(
            encoded(Value::String("foo".into()), r#""string""#),
            [0x06, b'f', b'o', b'o']
        );
        assert_eq!(
            encoded(
                Value::Array(vec![Value::Long(3), Value::Long(27)]),
                r#"{"type": "array", "items": "long"}"#
            ),
            [0x04, 0x06, 0x36, 0x00]
        );
        let union = r#"["null", "string"]"#;
        assert_eq!(
            encoded(Value::Union(0, Box::new(Value::Null)), union),
            [0x00]
        );
        assert_eq!(
            encoded(Value::Union(1, Box::new(Value::String("a".into()))), union),
            [0x02, 0x02, b'a']
        );
    }

    #[test]
    fn a_map_is_written_by_key() {
        let schema = Schema::parse_str(r#"{"type": "map", "values": "long"}"#).unwrap();
        let names = Names::of(&schema).unwrap();
        let map = Value::Map(
            [("b", 2), ("a", 1), ("c", 3)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::Long(v)))
                .collect(),
        );
        let mut out = Vec::new();
        write(&map, &schema, &names, &mut out).unwrap();
        assert_eq!(
            out,
            [0x06, 0x02, b'a', 0x02, 0x02, b'b', 0x04, 0x02, b'c', 0x06, 0x00]
        );
    }

    #[test]
    fn a_value_its_schema_does_not_take_is_an_error_naming_the_field() {
        let schema = Schema::parse_str(
            r#"{"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}"#,
        )
        .unwrap();
        let names = Names::of(&schema).unwrap();
        let mut out = Vec::new();
        let wrong = Value::Record(vec![("n".into(), Value::String("x".into()))]);
        let err = write(&wrong, &schema, &names, &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("n: "), "{err}");
        let missing = Value::Record(vec![]);
        let err = write(&missing, &schema, &names, &mut out)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "R has no field n");
    }
}
