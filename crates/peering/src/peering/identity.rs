//! Who this operator is among its peers: Kopf's `detect_own_id`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::{tz::TimeZone, Timestamp};

/// The characters of the random suffix, as in Kopf (no `g`: Kopf's own alphabet).
const ALPHABET: &[u8] = b"abcdefhijklmnopqrstuvwxyz0123456789";

/// This operator's identity in peering records, as Kopf makes it: the `POD_ID` environment variable
/// if set (point it at `metadata.name` with the downward API), else
/// `user@host/YYYYmmddHHMMSS/xyz`: who runs it, where, since when (UTC), and 3 random characters.
pub fn identity() -> String {
    if let Ok(pod) = std::env::var("POD_ID") {
        return pod;
    }
    let now = Timestamp::now()
        .to_zoned(TimeZone::UTC)
        .strftime("%Y%m%d%H%M%S")
        .to_string();
    let suffix: String = (0..3)
        .map(|_| {
            let i = random_below(ALPHABET.len() as u64) as usize;
            char::from(ALPHABET[i % ALPHABET.len()])
        })
        .collect();
    format!("{}/{now}/{suffix}", manual_identity())
}

/// The identity of a person's command (Kopf's `freeze`/`resume` without `--id`): `POD_ID` if set,
/// else `user@host`.
pub fn manual_identity() -> String {
    if let Ok(pod) = std::env::var("POD_ID") {
        return pod;
    }
    format!("{}@{}", user(), host())
}

/// The user running the process, as Python's `getpass.getuser()`: the first of `LOGNAME`, `USER`,
/// `LNAME`, `USERNAME` that is set, else the password database's name of the process's uid.
fn user() -> String {
    for variable in ["LOGNAME", "USER", "LNAME", "USERNAME"] {
        if let Ok(name) = std::env::var(variable) {
            if !name.is_empty() {
                return name;
            }
        }
    }
    uid_name().unwrap_or_else(|| "unknown".to_string())
}

#[cfg(unix)]
fn uid_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let entry_uid: u32 = fields.nth(1)?.parse().ok()?;
        (entry_uid == uid).then(|| name.to_string())
    })
}

#[cfg(not(unix))]
fn uid_name() -> Option<String> {
    None
}

/// The host's name, without Kopf's "useless suffixes" (`.local`, `.localdomain`).
fn host() -> String {
    let name = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    without_useless_suffixes(&name)
}

fn without_useless_suffixes(name: &str) -> String {
    let mut name = name;
    while let Some(stripped) = name
        .strip_suffix(".local")
        .or_else(|| name.strip_suffix(".localdomain"))
    {
        name = stripped;
    }
    name.to_string()
}

/// A random number below `bound` (0 if `bound` is 0). Not for cryptography: for jitter and names.
pub(crate) fn random_below(bound: u64) -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if bound == 0 {
        return 0;
    }
    // std's RandomState is seeded randomly per process (and varied per instance): hashing a counter
    // and the time with it is random enough for jitter and name suffixes, without a dependency.
    let mut hasher = RandomState::new().build_hasher();
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut hasher);
    Timestamp::now().as_nanosecond().hash(&mut hasher);
    hasher.finish() % bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_identity_is_user_at_host_slash_time_slash_three_chars() {
        if std::env::var("POD_ID").is_ok() {
            return;
        }
        let id = identity();
        let parts: Vec<&str> = id.rsplitn(3, '/').collect();
        assert_eq!(parts.len(), 3, "{id}");
        let (suffix, time, who) = (parts[0], parts[1], parts[2]);
        assert_eq!(suffix.len(), 3);
        assert!(suffix.bytes().all(|b| ALPHABET.contains(&b)), "{id}");
        assert_eq!(time.len(), 14);
        assert!(time.bytes().all(|b| b.is_ascii_digit()), "{id}");
        assert!(who.contains('@'), "{id}");
        assert_eq!(who, manual_identity());
    }

    #[test]
    fn useless_host_suffixes_are_removed() {
        assert_eq!(without_useless_suffixes("box.local.localdomain"), "box");
        assert_eq!(
            without_useless_suffixes("box.example.com"),
            "box.example.com"
        );
    }

    #[test]
    fn random_numbers_stay_below_the_bound_and_vary() {
        let draws: Vec<u64> = (0..200).map(|_| random_below(6)).collect();
        assert!(draws.iter().all(|d| *d < 6));
        assert!(draws.iter().any(|d| *d != draws[0]));
        assert_eq!(random_below(0), 0);
    }
}
