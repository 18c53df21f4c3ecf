//! The first choice's per-token data, read straight into numbers.
//!
//! vLLM writes a completion's logprobs as an object a token
//! (`{"token", "logprob", "bytes", "top_logprobs"}`). Read as JSON values
//! that is a map, four keys and their values allocated a token, and it was
//! the largest part of reading an answer after the prompt's ids. Here the
//! token ids and logprobs are read as what [`super::read_response`] takes
//! from them, leniently: a field of another kind reads as "none" (a NaN
//! logprob, no id), exactly as it did through the values, and never fails a
//! read that serde's own reading of the JSON would not fail.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Number, Value};
use std::fmt;

/// What the first choice carries per completion token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceTokens {
    /// `choices[0].token_ids`, when it is an array of u32.
    pub token_ids: Option<Vec<u32>>,
    /// `choices[0].logprobs.content`, when it is an array.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// One element of `logprobs.content`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// NaN when it is not a number.
    pub logprob: f64,
    /// From a token named `token_id:N` (vLLM's `--return-tokens-as-token-ids`).
    pub token_id: Option<u32>,
}

impl Default for TokenLogprob {
    fn default() -> Self {
        TokenLogprob {
            logprob: f64::NAN,
            token_id: None,
        }
    }
}

impl ChoiceTokens {
    /// Takes them out of a choice already read as a value (a recorded answer).
    pub fn take_from(choice: &mut Value) -> ChoiceTokens {
        let Some(choice) = choice.as_object_mut() else {
            return ChoiceTokens::default();
        };
        let mut tokens = ChoiceTokens::default();
        if let Some(ids) = choice.remove("token_ids") {
            tokens.token_ids = ids_of(&ids);
        }
        if let Some(logprobs) = choice.remove("logprobs") {
            tokens.logprobs = Lax::<Logprobs>::deserialize(logprobs).map_or(None, |l| l.0 .0);
        }
        tokens
    }
}

/// `value` as token ids, if it is an array of u32.
pub fn ids_of(value: &Value) -> Option<Vec<u32>> {
    Lax::<Ids>::deserialize(value).map_or(None, |l| l.0 .0)
}

/// Reads the `choices` array as a value, less its first choice's
/// `token_ids` and `logprobs`, which go to `.0`.
pub struct Choices<'a>(pub &'a mut ChoiceTokens);

/// Reads a choice as a value, less its `token_ids` and `logprobs`.
struct FirstChoice<'a>(&'a mut ChoiceTokens);

/// `Value`'s own reading of every kind but the one a seed reads its way.
macro_rules! value_otherwise {
    () => {
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            Value::deserialize(d)
        }
    };
}

impl<'de> DeserializeSeed<'de> for Choices<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        // A `choices` key met again replaces the first one, as in a map.
        *self.0 = ChoiceTokens::default();
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choices<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    value_otherwise!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut choices = Vec::new();
        if let Some(first) = seq.next_element_seed(FirstChoice(self.0))? {
            choices.push(first);
            while let Some(choice) = seq.next_element()? {
                choices.push(choice);
            }
        }
        Ok(Value::Array(choices))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

impl<'de> DeserializeSeed<'de> for FirstChoice<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FirstChoice<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    value_otherwise!();
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut choice = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "token_ids" => self.0.token_ids = map.next_value::<Lax<Ids>>()?.0 .0,
                "logprobs" => self.0.logprobs = map.next_value::<Lax<Logprobs>>()?.0 .0,
                _ => {
                    choice.insert(key, map.next_value()?);
                }
            }
        }
        Ok(Value::Object(choice))
    }
}

/// A value read leniently: what `T` makes of the kinds it reads, and
/// `T::default()` for any other, read through and dropped.
trait Lenient: Default {
    fn unsigned(n: u64) -> Option<Self> {
        Self::number(n as f64)
    }
    fn signed(n: i64) -> Option<Self> {
        Self::number(n as f64)
    }
    fn number(_: f64) -> Option<Self> {
        None
    }
    fn string(_: &str) -> Option<Self> {
        None
    }
    fn seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Self::default())
    }
    fn map<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Self::default())
    }
}

struct Lax<T>(T);

impl<'de, T: Lenient> Deserialize<'de> for Lax<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LaxVisitor(std::marker::PhantomData))
    }
}

struct LaxVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Lenient> Visitor<'de> for LaxVisitor<T> {
    type Value = Lax<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Lax<T>, E> {
        Ok(Lax(T::default()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Lax<T>, E> {
        Ok(Lax(T::signed(n).unwrap_or_default()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Lax<T>, E> {
        Ok(Lax(T::unsigned(n).unwrap_or_default()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Lax<T>, E> {
        Ok(Lax(T::number(n).unwrap_or_default()))
    }
    fn visit_str<E>(self, s: &str) -> Result<Lax<T>, E> {
        Ok(Lax(T::string(s).unwrap_or_default()))
    }
    fn visit_unit<E>(self) -> Result<Lax<T>, E> {
        Ok(Lax(T::default()))
    }
    fn visit_none<E>(self) -> Result<Lax<T>, E> {
        Ok(Lax(T::default()))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Lax<T>, D::Error> {
        Lax::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Lax<T>, A::Error> {
        T::seq(seq).map(Lax)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Lax<T>, A::Error> {
        T::map(map).map(Lax)
    }
}

/// A map key, read without keeping it.
enum Key {
    Logprob,
    Token,
    Content,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "logprob" => Key::Logprob,
                    "token" => Key::Token,
                    "content" => Key::Content,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// An array of token ids; `None` if any element is not a u32.
#[derive(Default)]
struct Ids(Option<Vec<u32>>);

#[derive(Default)]
struct Id(Option<u32>);

impl Lenient for Id {
    fn unsigned(n: u64) -> Option<Self> {
        Some(Id(u32::try_from(n).ok()))
    }
}

impl Lenient for Ids {
    fn seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut ids = Some(Vec::with_capacity(seq.size_hint().unwrap_or(0)));
        while let Some(Lax(Id(id))) = seq.next_element()? {
            match (&mut ids, id) {
                (Some(ids), Some(id)) => ids.push(id),
                _ => ids = None,
            }
        }
        Ok(Ids(ids))
    }
}

/// `logprobs`: its `content`, when that is an array.
#[derive(Default)]
struct Logprobs(Option<Vec<TokenLogprob>>);

impl Lenient for Logprobs {
    fn map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut content = None;
        while let Some(key) = map.next_key()? {
            match key {
                Key::Content => content = map.next_value::<Lax<Content>>()?.0 .0,
                _ => _ = map.next_value::<IgnoredAny>()?,
            }
        }
        Ok(Logprobs(content))
    }
}

/// `logprobs.content`: a token each, when it is an array.
#[derive(Default)]
struct Content(Option<Vec<TokenLogprob>>);

impl Lenient for Content {
    fn seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut tokens = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(Lax(token)) = seq.next_element()? {
            tokens.push(token);
        }
        Ok(Content(Some(tokens)))
    }
}

impl Lenient for TokenLogprob {
    fn map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut token = TokenLogprob::default();
        while let Some(key) = map.next_key()? {
            match key {
                Key::Logprob => token.logprob = map.next_value::<Lax<Logprob>>()?.0 .0,
                Key::Token => token.token_id = map.next_value::<Lax<TokenName>>()?.0 .0,
                _ => _ = map.next_value::<IgnoredAny>()?,
            }
        }
        Ok(token)
    }
}

struct Logprob(f64);

impl Default for Logprob {
    fn default() -> Self {
        Logprob(f64::NAN)
    }
}

impl Lenient for Logprob {
    fn number(n: f64) -> Option<Self> {
        Some(Logprob(n))
    }
}

/// A token's name, `token_id:N`: its id.
#[derive(Default)]
struct TokenName(Option<u32>);

impl Lenient for TokenName {
    fn string(s: &str) -> Option<Self> {
        Some(TokenName(token_id_of(s)))
    }
}

/// The id of a token named `token_id:N` (vLLM's `return_tokens_as_token_ids`).
pub fn token_id_of(name: &str) -> Option<u32> {
    name.strip_prefix("token_id:")?.parse().ok()
}

#[cfg(test)]
mod tests;
