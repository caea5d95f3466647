//! Formatting and statistics shared by the sections: sizes, percentiles,
//! medians, MiB, and the CPU figures' coarseness mark.

use crate::fanout::FanoutResult;

pub const COARSE_NOTE: &str =
    "  ~ CPU from fewer than 20 clock ticks: coarse, each process counts only to ±1 tick \
     (more events make it finer)";

pub fn size_name(size: usize) -> String {
    if size >= 1024 && (size / 1024) * 1024 == size {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// The `p` quantile of `sorted` (ns) in µs; NaN when empty.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// `v` with `prec` decimals, "?" when unknown.
pub fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or("?".into(), |x| format!("{x:.prec$}"))
}

/// kB as MiB, "?" when unknown.
pub fn kb(v: Option<u64>) -> String {
    v.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// A CPU µs/delivery figure of `r`, "~"-marked when coarse.
pub fn fmt_cpu(v: Option<f64>, r: &FanoutResult) -> String {
    let s = fmt_opt(v, 2);
    if r.cpu_coarse() && v.is_some() {
        format!("~{s}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert!(percentile(&[], 0.5).is_nan());
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
        assert_eq!(size_name(4096), "4 KiB");
        assert_eq!(size_name(256), "256 B");
        assert_eq!(fmt_opt(Some(f64::NAN), 1), "?");
    }
}
