//! How Kopf names its annotations: the full keys of the progress records, the diff-base and the
//! touch annotation under an operator's prefix, with Kopf's V1 and V2 shortening of lengthy names
//! (Kopf's `StorageKeyFormingConvention`), and the `<prefix>/kopf-managed` marker by which
//! Kopf-based operators recognise each other's annotations (`StorageKeyMarkingConvention`).
//!
//! The keys are byte-identical to Kopf's, so an operator can move between Kopf and kactor with
//! its in-flight handler progress intact.
//!
//! **Caveat:** Kopf suffixes every key with `-ofDRS` for a `ReplicaSet` owned by a `Deployment`
//! (Kubernetes copies a Deployment's annotations down to its ReplicaSets). kactor does not do
//! that collision evasion yet: for such objects, its keys differ from Kopf's.

use base64::alphabet::Alphabet;
use base64::engine::general_purpose::{GeneralPurpose, PAD};
use base64::Engine;
use blake2::digest::consts::U4;
use blake2::{Blake2b, Digest};

/// The longest a name (the part after `<prefix>/`) may be, as Kubernetes allows and Kopf enforces.
const MAX_NAME_LENGTH: usize = 63;

/// The name that marks a prefix as managed by a Kopf-based operator, as in Kopf.
pub const MARKER_NAME: &str = "kopf-managed";

/// The default prefix of all of Kopf's annotations, as in Kopf.
pub const DEFAULT_PREFIX: &str = "kopf.zalando.org";

/// Kopf's annotation key forming: `<prefix>/<name>`, shortened with a hash when too long.
///
/// Kopf writes two versions of each key while `v1` is on (its default):
///
/// * **V2** (always written, read first): the *name* part is limited to 63 characters. A longer
///   name is cut and suffixed with `-` and a base64 (`-.` altchars) blake2b-32 hash of the
///   unsanitised name, e.g. `'x'*64` gives `'x'*56 + '-SItAqA'`.
/// * **V1** (written and read while `v1` is on, only if it differs from V2): the 63-character
///   limit applies to the whole `<prefix>/<name>`, and the hash is of the sanitised name.
///
/// Names are sanitised by replacing `/` with `.` and `<`, `>` with `_`, so the sub-handler
/// `create_fn/item1` is stored as `kopf.zalando.org/create_fn.item1`. Lengths are counted in
/// characters (Unicode code points), as Python does, not in bytes.
///
/// # Caveats
/// * With a prefix longer than 61 characters, V1 keys are cut from the *end* of the name (the
///   result of Python's negative slice indices in Kopf). kactor reproduces this, oddities
///   included, so that it reads and purges the keys Kopf wrote.
/// * Kopf refuses an empty prefix and warns about one longer than 189 characters (253 − 63 − 1),
///   since the keys may then exceed Kubernetes' limit of 253; see [`KeyForming::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyForming {
    /// The DNS-like prefix before the `/`, e.g. `kopf.zalando.org`.
    pub prefix: String,
    /// Whether V1 keys are also written and read (default `true`, as in Kopf 1.45).
    pub v1: bool,
}

impl Default for KeyForming {
    /// `kopf.zalando.org` with V1 keys on, as in Kopf.
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            v1: true,
        }
    }
}

/// Errors of [`KeyForming::new`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyFormingError {
    /// The prefix is empty.
    #[error(
        "annotation storages must be prefixed; use a DNS-like prefix such as `my-op.example.com`"
    )]
    EmptyPrefix,
}

impl KeyForming {
    /// A key forming with the given prefix and V1 keys on, validated as Kopf does: an empty prefix
    /// is refused, and a prefix longer than 189 characters logs a warning (the keys can then be
    /// longer than the 253 characters Kubernetes allows, and patching would fail).
    ///
    /// ```
    /// use kactor_reactor::keys::KeyForming;
    /// let keys = KeyForming::new("my-op.example.com").unwrap();
    /// assert_eq!(keys.v2("create_fn/item1"), "my-op.example.com/create_fn.item1");
    /// ```
    pub fn new(prefix: impl Into<String>) -> Result<Self, KeyFormingError> {
        let prefix = prefix.into();
        if prefix.is_empty() {
            return Err(KeyFormingError::EmptyPrefix);
        }
        if prefix.chars().count() > 253 - MAX_NAME_LENGTH - 1 {
            tracing::warn!(
                prefix = %prefix,
                "The annotations prefix is too long. It can cause errors when PATCHing."
            );
        }
        Ok(Self { prefix, v1: true })
    }

    /// All full keys of a name, in the order to read them: V2 first, then V1 if `v1` is on and it
    /// differs from V2.
    pub fn keys(&self, name: &str) -> Vec<String> {
        self.each(name).collect()
    }

    /// The keys of [`keys`](Self::keys), without a vector to hold them (the storages form them
    /// several times per object and cycle).
    pub fn each(&self, name: &str) -> Keys {
        if let Some(key) = self.plain(name) {
            return Keys([Some(key), None]);
        }
        let v2 = self.v2(name);
        let v1 = self.v1.then(|| self.v1(name)).filter(|v1| *v1 != v2);
        Keys([Some(v2), v1])
    }

    /// The one key of a name that neither V1 nor V2 changes (no character to replace, short enough
    /// for both limits): `<prefix>/<name>`, formed without the two versions' intermediate strings.
    /// Handler ids and the storages' own names are nearly always such names, and their keys are
    /// formed several times per object and cycle.
    fn plain(&self, name: &str) -> Option<String> {
        let replaced = |b: &u8| matches!(b, b'/' | b'<' | b'>');
        if !name.is_ascii() || name.as_bytes().iter().any(replaced) {
            return None;
        }
        let prefix = if self.prefix.is_empty() {
            0
        } else {
            char_len(&self.prefix) + 1
        };
        // V1's room may be negative with a prefix over 62 characters (then V1 hashes even "").
        let limit = if self.v1 {
            MAX_NAME_LENGTH as isize - prefix as isize
        } else {
            MAX_NAME_LENGTH as isize
        };
        if name.len() as isize > limit {
            return None;
        }
        let mut key = String::with_capacity(self.prefix.len() + 1 + name.len());
        if !self.prefix.is_empty() {
            key.push_str(&self.prefix);
            key.push('/');
        }
        key.push_str(name);
        Some(key)
    }

    /// The V2 key of a name: the name part limited to 63 characters.
    pub fn v2(&self, name: &str) -> String {
        let suffix = if char_len(name) > MAX_NAME_LENGTH {
            hash_suffix(name)
        } else {
            String::new()
        };
        let limit = MAX_NAME_LENGTH.saturating_sub(char_len(&suffix));
        let safe: String = sanitise(name).chars().take(limit).collect();
        format!("{}{safe}{suffix}", self.full_prefix())
    }

    /// The V1 key of a name: the whole key limited to 63 characters.
    pub fn v1(&self, name: &str) -> String {
        let prefix = self.full_prefix();
        let safe = sanitise(name);
        let room = MAX_NAME_LENGTH as isize - char_len(&prefix) as isize;
        let suffix = if char_len(&safe) as isize <= room {
            String::new()
        } else {
            hash_suffix(&safe)
        };
        let kept = python_head(&safe, room - char_len(&suffix) as isize);
        format!("{prefix}{kept}{suffix}")
    }

    /// The marker annotation key, `<prefix>/kopf-managed`, written (with the value `yes`) when
    /// the prefix does not start with `kopf.`, so that other Kopf-based operators exclude our
    /// annotations from their diff-base and do not react to our writes.
    pub fn marker(&self) -> Option<String> {
        if self.prefix.is_empty() || self.prefix.starts_with("kopf.") {
            None
        } else {
            Some(format!("{}/{MARKER_NAME}", self.prefix))
        }
    }

    fn full_prefix(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }
}

/// The full keys of a name, in the order to read them ([`KeyForming::each`]).
#[derive(Debug)]
pub struct Keys([Option<String>; 2]);

impl Iterator for Keys {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(Option::take)
    }
}

/// The prefixes of annotations managed by Kopf-based operators (including ours): those with a
/// `<prefix>/kopf-managed` key, `kopf.zalando.org`, and any `*.kopf.zalando.org`.
pub(crate) fn marked_prefixes<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut prefixes: Vec<&str> = keys
        .into_iter()
        .filter_map(|key| key.split_once('/'))
        .filter(|(prefix, name)| {
            *name == MARKER_NAME
                || *prefix == DEFAULT_PREFIX
                || prefix
                    .strip_suffix(DEFAULT_PREFIX)
                    .is_some_and(|head| head.ends_with('.'))
        })
        .map(|(prefix, _)| prefix)
        .collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    prefixes
}

fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Kubernetes allows only some characters in keys; these are the ones Kopf replaces.
fn sanitise(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '/' => '.',
            '<' | '>' => '_',
            c => c,
        })
        .collect()
}

/// `-` and the base64 of the 4-byte blake2b digest, ending in an alphanumeric character.
fn hash_suffix(text: &str) -> String {
    let digest = Blake2b::<U4>::digest(text.as_bytes());
    let encoded = ALTCHARS_ENGINE.encode(digest);
    format!("-{encoded}")
        .trim_end_matches(['=', '-', '.'])
        .to_string()
}

/// Base64 with Kopf's `-.` instead of `+/`, so the hash is valid in annotation keys.
const ALTCHARS: Alphabet =
    match Alphabet::new("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-.") {
        Ok(alphabet) => alphabet,
        // Evaluated at compile time: an invalid alphabet fails the build, never a run.
        Err(_) => panic!("invalid base64 alphabet"),
    };

const ALTCHARS_ENGINE: GeneralPurpose = GeneralPurpose::new(&ALTCHARS, PAD);

/// Python's `s[:n]` on characters, negative `n` counting from the end.
fn python_head(s: &str, n: isize) -> String {
    let len = char_len(s) as isize;
    let n = if n < 0 { (len + n).max(0) } else { n.min(len) };
    s.chars().take(n as usize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_get_the_same_v1_and_v2_key() {
        let keys = KeyForming::default();
        assert_eq!(keys.keys("create_fn"), vec!["kopf.zalando.org/create_fn"]);
    }

    #[test]
    fn sub_handler_slashes_become_dots() {
        let keys = KeyForming::default();
        assert_eq!(
            keys.v2("create_fn/item1"),
            "kopf.zalando.org/create_fn.item1"
        );
        assert_eq!(keys.v2("a<b>c"), "kopf.zalando.org/a_b_c");
    }

    #[test]
    fn a_64_character_name_is_cut_and_hashed() {
        let keys = KeyForming::default();
        let name = "x".repeat(64);
        assert_eq!(
            keys.v2(&name),
            format!("kopf.zalando.org/{}-SItAqA", "x".repeat(56))
        );
    }

    #[test]
    fn plain_names_get_the_keys_both_versions_form() {
        let prefixes = [
            "kopf.zalando.org",
            "my-op.example.com",
            &"p".repeat(62),
            &"p".repeat(63),
            &"p".repeat(70),
        ];
        let names = [
            "create_fn".to_string(),
            "create_fn/item1".to_string(),
            "a<b>c".to_string(),
            "ünï".to_string(),
            "x".repeat(44),
            "x".repeat(45),
            "x".repeat(46),
            "x".repeat(63),
            "x".repeat(64),
            String::new(),
        ];
        for prefix in prefixes {
            for v1 in [true, false] {
                let keys = KeyForming {
                    prefix: prefix.to_string(),
                    v1,
                };
                for name in &names {
                    let mut slow = vec![keys.v2(name)];
                    if v1 && keys.v1(name) != slow[0] {
                        slow.push(keys.v1(name));
                    }
                    assert_eq!(keys.keys(name), slow, "{prefix} {name} v1={v1}");
                }
            }
        }
    }

    #[test]
    fn v1_keys_are_omitted_when_v1_is_off() {
        let keys = KeyForming {
            v1: false,
            ..Default::default()
        };
        assert_eq!(keys.keys(&"x".repeat(64)).len(), 1);
    }

    #[test]
    fn v1_key_follows_v2_key_when_they_differ() {
        let keys = KeyForming::default();
        let all = keys.keys(&"x".repeat(48));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], keys.v2(&"x".repeat(48)));
        assert_eq!(all[1], keys.v1(&"x".repeat(48)));
    }

    #[test]
    fn kopf_prefixes_get_no_marker() {
        assert_eq!(KeyForming::default().marker(), None);
        let custom = KeyForming::new("my-op.example.com").unwrap();
        assert_eq!(
            custom.marker().as_deref(),
            Some("my-op.example.com/kopf-managed")
        );
    }

    #[test]
    fn an_empty_prefix_is_refused() {
        assert_eq!(KeyForming::new(""), Err(KeyFormingError::EmptyPrefix));
    }

    #[test]
    fn marked_prefixes_include_kopf_domains_and_markers() {
        let keys = [
            "kopf.zalando.org/a",
            "x.kopf.zalando.org/b",
            "their.example.com/kopf-managed",
            "their.example.com/c",
            "example.com/d",
            "no-slash",
        ];
        assert_eq!(
            marked_prefixes(keys),
            vec![
                "kopf.zalando.org",
                "their.example.com",
                "x.kopf.zalando.org"
            ]
        );
    }

    #[test]
    fn python_head_counts_negative_lengths_from_the_end() {
        assert_eq!(python_head("abcdef", 2), "ab");
        assert_eq!(python_head("abcdef", -2), "abcd");
        assert_eq!(python_head("abcdef", -10), "");
        assert_eq!(python_head("abc", 10), "abc");
    }
}
