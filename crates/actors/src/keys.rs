//! The supervisor's key of an object's record, kept without a heap allocation for the usual key.
//!
//! Objects are routed by their `metadata.uid` ([`kactor_reactor::resources::object_key`]), which
//! the API server makes a UUID in its canonical form. Kept as its 128 bits, the key lives inside
//! the records' table: a key of its own on the heap, made while a burst of workers runs, would
//! keep a page of the burst resident per object long after the burst (see [`crate::memory`]).
//! Any other key (an object without a uid, a uid in another form) is kept as it is.

use std::sync::Arc;

/// An object's routing key, as the records keep it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RecordKey {
    /// A uid in the canonical form (lowercase, hyphenated), as its bits.
    Uuid(u128),
    /// Any other key, as it is.
    Other(Arc<str>),
}

impl RecordKey {
    /// The record key of a routing key.
    pub(crate) fn of(key: &Arc<str>) -> RecordKey {
        match parse_canonical_uuid(key) {
            Some(bits) => RecordKey::Uuid(bits),
            None => RecordKey::Other(key.clone()),
        }
    }

    /// The routing key again, exactly as it was.
    pub(crate) fn to_key(&self) -> Arc<str> {
        match self {
            RecordKey::Uuid(bits) => Arc::from(format_uuid(*bits).as_str()),
            RecordKey::Other(key) => key.clone(),
        }
    }
}

/// The bits of `text` if it is a UUID in the canonical form (lowercase, hyphenated: the one
/// `format_uuid` writes, so that the key comes back byte for byte), else None. One pass over the
/// bytes: the supervisor takes the key of every message about an object (`uuid`'s parser also
/// takes uppercase digits, which would need a scan of their own first, and cost twice as much).
fn parse_canonical_uuid(text: &str) -> Option<u128> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut bits: u128 = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let hyphen = matches!(i, 8 | 13 | 18 | 23);
        let nibble = match byte {
            b'-' if hyphen => continue,
            b'0'..=b'9' if !hyphen => byte - b'0',
            b'a'..=b'f' if !hyphen => byte - b'a' + 10,
            _ => return None,
        };
        bits = bits << 4 | u128::from(nibble);
    }
    Some(bits)
}

/// `bits` as a lowercase hyphenated UUID (8-4-4-4-12).
fn format_uuid(bits: u128) -> String {
    uuid::Uuid::from_u128(bits).hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canonical_uid_is_kept_as_bits_and_comes_back_byte_for_byte() {
        for uid in [
            "0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5e6f",
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "01234567-89ab-cdef-0123-456789abcdef",
        ] {
            let key: Arc<str> = Arc::from(uid);
            let record = RecordKey::of(&key);
            let bits = uuid::Uuid::parse_str(uid).unwrap().as_u128();
            assert_eq!(record, RecordKey::Uuid(bits), "{uid}: the bits uuid reads");
            assert_eq!(&*record.to_key(), uid);
        }
    }

    #[test]
    fn any_other_key_is_kept_as_it_is() {
        for other in [
            // Upper case would not come back the same.
            "0B6C3F1E-8A4D-4C2B-9F7E-1A2B3C4D5E6F",
            "0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5E6f",
            // 36 characters, the hyphens elsewhere.
            "0b6c3f1e8-a4d-4c2b-9f7e-1a2b3c4d5e6f",
            "-0b6c3f1e8a4d-4c2b-9f7e-1a2b3c4d5e6f",
            "0b6c3f1e8a4d4c2b9f7e1a2b3c4d5e6f",
            "0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5e6",
            "0b6c3f1e-8a4d-4c2b-9f7e_1a2b3c4d5e6f",
            "0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5e6g",
            "my-uid",
            "",
            "Widget//example.com/v1//w1//default//-",
            // 36 bytes, not ASCII where the digits go.
            "0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5é",
        ] {
            let key: Arc<str> = Arc::from(other);
            let record = RecordKey::of(&key);
            assert_eq!(record, RecordKey::Other(key.clone()), "{other}");
            assert_eq!(&*record.to_key(), other);
        }
    }

    #[test]
    fn different_uids_are_different_keys() {
        let a = RecordKey::of(&Arc::from("0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5e6f"));
        let b = RecordKey::of(&Arc::from("0b6c3f1e-8a4d-4c2b-9f7e-1a2b3c4d5e60"));
        assert_ne!(a, b);
    }
}
