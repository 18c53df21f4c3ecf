//! Packed little-endian arrays for per-token data.
//!
//! A call can carry 100k prompt tokens; as an Avro `array<int>` every id costs a
//! varint and a `Value` allocation on decode. As `bytes` holding little-endian
//! words they cost exactly 4 bytes each and decode with one copy. Human-readable
//! serializers (JSON for `forgelog tail`) see plain number arrays instead.

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;
use std::marker::PhantomData;

/// A fixed-width number stored little-endian in a packed byte array.
pub trait Packed: Copy + serde::Serialize + for<'de> serde::Deserialize<'de> {
    const WIDTH: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! packed_number {
    ($($t:ty),*) => {$(
        impl Packed for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("chunk of WIDTH bytes"))
            }
        }
    )*};
}
packed_number!(u8, u32, f32);

/// Packs `values` into little-endian bytes.
pub fn pack<T: Packed>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::WIDTH);
    for &v in values {
        v.put(&mut out);
    }
    out
}

/// Unpacks little-endian bytes; `None` when the length is not a multiple of the width.
pub fn unpack<T: Packed>(bytes: &[u8]) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(T::WIDTH) {
        return None;
    }
    Some(bytes.chunks_exact(T::WIDTH).map(T::get).collect())
}

/// `#[serde(with = "packed")]` for `Vec<u8 | u32 | f32>` fields.
pub fn serialize<T: Packed, S: Serializer>(values: &[T], s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        s.collect_seq(values)
    } else {
        s.serialize_bytes(&pack(values))
    }
}

/// See [`serialize`]; accepts packed bytes or a plain sequence.
pub fn deserialize<'de, T: Packed, D: Deserializer<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct PackedVisitor<T>(PhantomData<T>);
    impl<'de, T: Packed> Visitor<'de> for PackedVisitor<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "bytes holding {}-byte little-endian numbers", T::WIDTH)
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<T>, E> {
            unpack(v).ok_or_else(|| {
                E::custom(format!(
                    "packed array of {} bytes is not a multiple of {}",
                    v.len(),
                    T::WIDTH
                ))
            })
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(v) = seq.next_element()? {
                out.push(v);
            }
            Ok(out)
        }
    }
    if d.is_human_readable() {
        d.deserialize_seq(PackedVisitor(PhantomData))
    } else {
        d.deserialize_bytes(PackedVisitor(PhantomData))
            .map_err(|e| D::Error::custom(format!("packed field: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_ragged_lengths() {
        let ids = vec![0u32, 1, 49151, u32::MAX];
        assert_eq!(pack(&ids).len(), 16);
        assert_eq!(unpack::<u32>(&pack(&ids)).unwrap(), ids);
        let lps = vec![-0.03f32, 0.0, -17.5];
        assert_eq!(unpack::<f32>(&pack(&lps)).unwrap(), lps);
        assert!(unpack::<u32>(&[1, 2, 3]).is_none());
    }
}
