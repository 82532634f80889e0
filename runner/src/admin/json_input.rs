//! Request JSON read as the OpenAPI document describes it, where serde's derived readers and
//! JSON Schema (the document's language) disagree.
//!
//! Owns: [`from_slice`] (a body whose structs are read from JSON objects only) and the
//! integer field readers ([`integer`], [`optional_integer`], [`present_integer`]).
//!
//! Invariants:
//! - a request struct is read from a JSON object only, at the top of the body and as an
//!   element of a top-level array: serde's derive also reads a struct from an array of its
//!   fields in order (`[null, null]` as `{"max_module_bytes": null, "max_fuel": null}`),
//!   which the document (`type: object`) calls invalid;
//! - an integer field takes what JSON Schema calls an integer: `5`, and also `5.0` or `5e0`
//!   (a number whose fraction is zero), which serde refuses for integer types; anything with
//!   a fraction, or out of the field's range, stays an error.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// Parses `bytes` as `T`, reading every struct at the top or in a top-level array from a
/// JSON object only.
pub fn from_slice<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> serde_json::Result<T> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let value = T::deserialize(ObjectsOnly(&mut json))?;
    json.end()?;
    Ok(value)
}

/// A deserializer that reads structs as maps (serde_json then refuses an array where a
/// struct is expected) and passes the same rule on to the elements of a sequence.
struct ObjectsOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_seq(Elements(visitor))
    }

    // Request bodies are structs or sequences of them; nothing else reaches these.
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// Visits a sequence whose elements are read through [`ObjectsOnly`].
struct Elements<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for Elements<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(ElementsAccess(seq))
    }
}

struct ElementsAccess<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for ElementsAccess<A> {
    type Error = A::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        self.0.next_element_seed(Element(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct Element<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Element<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(ObjectsOnly(d))
    }
}

/// An integer as JSON Schema counts them (`5`, `5.0`), in `T`'s range.
pub(crate) struct Integer<T>(pub T);

impl<'de, T> Deserialize<'de> for Integer<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntegerVisitor(PhantomData)).map(Integer)
    }
}

struct IntegerVisitor<T>(PhantomData<T>);

impl<'de, T> Visitor<'de> for IntegerVisitor<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an integer that fits {}", std::any::type_name::<T>())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        // 2^63 and 2^64 are exact in f64; every integral value below them converts exactly.
        const I64_END: f64 = 9_223_372_036_854_775_808.0;
        const U64_END: f64 = 18_446_744_073_709_551_616.0;
        let out_of_range = || E::invalid_value(de::Unexpected::Float(v), &self);
        if v.fract() != 0.0 || !v.is_finite() {
            return Err(E::invalid_type(de::Unexpected::Float(v), &self));
        }
        if (0.0..U64_END).contains(&v) {
            T::try_from(v as u64).map_err(|_| out_of_range())
        } else if (-I64_END..0.0).contains(&v) {
            T::try_from(v as i64).map_err(|_| out_of_range())
        } else {
            Err(out_of_range())
        }
    }
}

/// `#[serde(deserialize_with)]` for an integer field.
pub fn integer<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Integer::deserialize(d).map(|i| i.0)
}

/// `#[serde(default, deserialize_with)]` for an optional integer field (`null` is `None`).
pub fn optional_integer<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Option::<Integer<T>>::deserialize(d).map(|o| o.map(|i| i.0))
}

/// `#[serde(default, deserialize_with)]` for an integer field where being present matters:
/// absent stays `None` (the default), `null` is `Some(None)`, a number `Some(Some(n))`.
pub fn present_integer<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    optional_integer(d).map(Some)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Pair {
        #[serde(deserialize_with = "integer")]
        a: i32,
        #[serde(default, deserialize_with = "optional_integer")]
        b: Option<u64>,
        #[serde(default, deserialize_with = "present_integer")]
        c: Option<Option<i64>>,
    }

    #[test]
    fn structs_come_from_objects_only() {
        let p: Pair = from_slice(br#"{"a": 1}"#).unwrap();
        assert_eq!(p, Pair { a: 1, b: None, c: None });
        assert!(serde_json::from_slice::<Pair>(b"[1, 2, null]").is_ok(), "serde alone takes it");
        let e = from_slice::<Pair>(b"[1, 2, null]").unwrap_err();
        assert!(e.to_string().contains("invalid type: sequence"), "{e}");
        let many: Vec<Pair> = from_slice(br#"[{"a": 1}, {"a": 2}]"#).unwrap();
        assert_eq!(many.len(), 2);
        assert!(from_slice::<Vec<Pair>>(br#"[{"a": 1}, [2]]"#).is_err());
        assert!(from_slice::<Pair>(br#"{"a": 1} x"#).is_err(), "trailing input");
    }

    #[test]
    fn integers_may_be_written_with_a_zero_fraction() {
        let p: Pair = from_slice(br#"{"a": -7.0, "b": 1e3, "c": 5.0}"#).unwrap();
        assert_eq!(p, Pair { a: -7, b: Some(1000), c: Some(Some(5)) });
        let p: Pair = from_slice(br#"{"a": 0, "b": null, "c": null}"#).unwrap();
        assert_eq!(p, Pair { a: 0, b: None, c: Some(None) });
        for bad in [
            r#"{"a": 1.5}"#,
            r#"{"a": 3000000000}"#,
            r#"{"a": 3e9}"#,
            r#"{"a": "1"}"#,
            r#"{"a": 1, "b": -1}"#,
            r#"{"a": 1, "b": -1.0}"#,
            r#"{"a": 1, "b": 1e20}"#,
            r#"{"a": 1, "c": 1e300}"#,
        ] {
            assert!(from_slice::<Pair>(bad.as_bytes()).is_err(), "{bad}");
        }
        let e = from_slice::<Pair>(br#"{"a": 2.5}"#).unwrap_err().to_string();
        assert!(e.contains("an integer that fits i32"), "{e}");
    }
}
