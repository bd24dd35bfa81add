//! How the health messages write what they measure.

use std::time::Duration;

/// A duration in seconds as the messages show it: whole seconds from 10 s, tenths below.
pub(crate) fn seconds(duration: Duration) -> String {
    if duration >= Duration::from_secs(10) {
        duration.as_secs().to_string()
    } else {
        format!("{:.1}", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_whole_from_ten_and_tenths_below() {
        assert_eq!(seconds(Duration::from_millis(131_400)), "131");
        assert_eq!(seconds(Duration::from_millis(2_345)), "2.3");
        assert_eq!(seconds(Duration::from_millis(50)), "0.1");
    }
}
