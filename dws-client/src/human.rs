//! Times and durations as people read them, for text output only (JSON
//! keeps its numbers): a duration in its two largest units (`59m 20s`,
//! `3h 5m`, `2d 4h`; `850ms` under a second), a point in time in local
//! RFC 3339 (`2026-12-03T18:32:00+08:00`, the offset the system's time
//! zone has at that moment). The formatting is pure and unit-tested; only
//! [`local_offset_secs`] asks the system.

/// `ms` milliseconds as people read them: `0s`, `850ms`, `31s`, `59m 20s`,
/// `3h 5m`, `2d 4h` (the two largest units, the rest left out).
pub fn duration_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let mut parts = vec![];
    let mut rest = secs;
    for (name, size) in units {
        let n = rest / size;
        rest %= size;
        if n > 0 || !parts.is_empty() {
            parts.push((n, name));
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A signed duration (a time in the past or the future).
pub fn duration_signed_ms(ms: i64) -> String {
    duration_ms(ms.unsigned_abs())
}

/// `t` relative to `now` (both unix ms): `10m 31s ago`, or `in 5s`.
pub fn ago(now_ms: i64, t: i64) -> String {
    if t <= now_ms {
        format!("{} ago", duration_signed_ms(now_ms - t))
    } else {
        format!("in {}", duration_signed_ms(t - now_ms))
    }
}

/// The system clock, unix ms.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `t` (unix ms) in local RFC 3339, to the second.
pub fn local_time(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    rfc3339(secs, local_offset_secs(secs))
}

/// The system time zone's offset from UTC at `unix_secs`, in seconds east
/// (0 when it cannot be told).
pub fn local_offset_secs(unix_secs: i64) -> i32 {
    let t = unix_secs as libc::time_t;
    // SAFETY: `tm` is plain data written by localtime_r, which reads `t`
    // only; the reentrant form shares no static buffer.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff as i32
    }
}

/// `unix_secs` at `offset` seconds east of UTC, as RFC 3339 (`Z` for 0).
pub fn rfc3339(unix_secs: i64, offset: i32) -> String {
    let local = unix_secs + i64::from(offset);
    let (days, secs) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let zone = match offset {
        0 => "Z".to_owned(),
        o => {
            let sign = if o < 0 { '-' } else { '+' };
            let o = o.unsigned_abs();
            format!("{sign}{:02}:{:02}", o / 3600, (o % 3600) / 60)
        }
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{zone}",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

/// The civil date of `days` since 1970-01-01 (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_their_two_largest_units() {
        assert_eq!(duration_ms(0), "0s");
        assert_eq!(duration_ms(850), "850ms");
        assert_eq!(duration_ms(31_700), "31s");
        assert_eq!(duration_ms(3_560_500), "59m 20s");
        assert_eq!(duration_ms(631_700), "10m 31s");
        assert_eq!(duration_ms(846_100), "14m 6s");
        assert_eq!(duration_ms(3_600_000), "1h");
        assert_eq!(duration_ms(3_660_000), "1h 1m");
        assert_eq!(duration_ms(7_205_000), "2h");
        assert_eq!(duration_ms(2 * 86_400_000 + 4 * 3_600_000 + 5_000), "2d 4h");
        assert_eq!(duration_signed_ms(-5_000), "5s");
        assert_eq!(ago(10_000, 4_000), "6s ago");
        assert_eq!(ago(10_000, 15_000), "in 5s");
    }

    #[test]
    fn times_in_rfc_3339_with_their_offset() {
        // 2026-12-04T01:52:00.057Z
        let t = 1_796_349_120;
        assert_eq!(rfc3339(t, 0), "2026-12-04T01:52:00Z");
        assert_eq!(rfc3339(t, 8 * 3600), "2026-12-04T09:52:00+08:00");
        assert_eq!(rfc3339(t, -(5 * 3600 + 1800)), "2026-12-03T20:22:00-05:30");
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert!(local_time(1_796_349_120_057).len() >= 20);
    }
}
