//! A log-linear histogram of nanoseconds that one thread writes and any reads, without a
//! lock: the control queue's latencies (`stats::CtrlStats`), as `ctl stats` shows their
//! quantiles and `/metrics` their buckets.

use serde::Serialize;

use crate::counter::Counter;

/// Sub-buckets per power of two: a quantile is read to within a quarter of its value.
const SUB: usize = 4;
/// Octaves kept: up to 2^40 ns (18 minutes); anything longer counts in the last bucket.
const OCTAVES: usize = 40;

/// A log-linear histogram of nanoseconds, written by one thread (the control thread) and
/// read by any: one counter per bucket, no lock.
#[derive(Debug)]
pub struct Histogram {
    buckets: Vec<Counter>,
    /// Every value recorded, added up.
    sum: Counter,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..SUB * (OCTAVES + 1)).map(|_| Counter::default()).collect(),
            sum: Counter::default(),
        }
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let octave = 63 - v.leading_zeros() as usize; // >= 2
        let sub = ((v >> (octave - 2)) & (SUB as u64 - 1)) as usize;
        (SUB * (octave - 1) + sub).min(SUB * (OCTAVES + 1) - 1)
    }

    /// The largest value bucket `i` holds.
    fn upper(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let octave = i / SUB + 1;
        let sub = (i % SUB) as u64;
        ((SUB as u64 + sub + 1) << (octave - 2)) - 1
    }

    pub fn record(&self, ns: u64) {
        self.buckets[Self::index(ns)].inc();
        self.sum.add(ns);
    }

    /// Cumulative counts at the bounds `le_ns` (ascending), as a Prometheus histogram
    /// exports them. A value is counted at the first bound at or above the top of its
    /// bucket, so never below its own value and at most a quarter above it.
    pub fn buckets(&self, le_ns: &'static [u64]) -> Buckets {
        let counts: Vec<u64> = self.buckets.iter().map(Counter::get).collect();
        let cumulative = le_ns
            .iter()
            .map(|&b| {
                let within = counts.iter().enumerate().filter(|(i, _)| Self::upper(*i) <= b);
                within.map(|(_, c)| c).sum()
            })
            .collect();
        Buckets {
            le_ns,
            cumulative,
            count: counts.iter().sum(),
            sum_ns: self.sum.get(),
        }
    }

    /// The value below which a fraction `q` of the recorded values lie, to within a quarter
    /// (the upper end of its bucket); 0 with nothing recorded.
    pub fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(Counter::get).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::upper(i);
            }
        }
        Self::upper(counts.len() - 1)
    }
}

/// A [`Histogram`] read at fixed bounds ([`Histogram::buckets`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Buckets {
    /// The bounds, in ns, ascending.
    pub le_ns: &'static [u64],
    /// Values at or below each bound.
    pub cumulative: Vec<u64>,
    /// Values recorded, and their sum.
    pub count: u64,
    pub sum_ns: u64,
}

/// Quantiles of a [`Histogram`], as `ctl stats` shows them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Quantiles {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl Histogram {
    pub fn quantiles(&self) -> Quantiles {
        Quantiles {
            p50_ns: self.quantile(0.5),
            p99_ns: self.quantile(0.99),
            max_ns: self.quantile(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_quarter() {
        let h = Histogram::default();
        assert_eq!(h.quantile(0.99), 0);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        for (q, exact) in [(0.5, 500_000u64), (0.99, 990_000), (1.0, 1_000_000)] {
            let got = h.quantile(q);
            assert!(
                got >= exact && got <= exact + exact / 4,
                "q {q}: {got} for {exact}"
            );
        }
        // Every bucket's range starts where the one before ends.
        for i in 1..SUB * (OCTAVES + 1) {
            assert_eq!(Histogram::index(Histogram::upper(i - 1) + 1), i, "bucket {i}");
        }
        h.record(u64::MAX);
        assert!(h.quantile(1.0) >= 1 << OCTAVES);
    }
}
