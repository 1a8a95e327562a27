//! Skewed (Zipfian) row ids for the lookup benchmark: rank k of 1..=n is drawn with probability
//! proportional to 1/k^s, and ranks are mapped to ids by a fixed permutation so that the hot rows
//! are spread over the table's pages instead of sitting together at its start.
//!
//! Sampling is Hörmann and Derflinger's rejection-inversion ("Rejection-inversion to generate
//! variates from monotone discrete distributions", 1996), the method of Apache Commons' and
//! rand_distr's Zipf samplers: constant memory and time per draw, whatever n is, so a stock
//! SQLite configuration in its memory cgroup pays nothing for a table of the ids' weights.

use anyhow::ensure;
use rand::Rng;

/// The exponent the lookup benchmark uses (YCSB's "zipfian" constant).
pub const LOOKUP_EXPONENT: f64 = 0.99;

#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
    /// The rank -> id permutation: id = (rank x stride) mod n + 1, stride coprime to n.
    stride: u64,
}

impl Zipf {
    /// Ranks 1..=`n` with exponent `s` (> 0).
    pub fn new(n: u64, s: f64) -> anyhow::Result<Zipf> {
        ensure!(n >= 1, "a Zipf distribution needs at least one element");
        ensure!(
            s.is_finite() && s > 0.0,
            "the Zipf exponent must be a number above 0, not {s}"
        );
        let mut z = Zipf {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
            stride: scramble_stride(n),
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// A rank in 1..=n, rank 1 the most likely.
    pub fn rank<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        loop {
            let u: f64 = rng.gen();
            let u = self.h_integral_n + u * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n as f64);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// The row id of `rank` (1..=n): a permutation of 1..=n.
    pub fn id_of_rank(&self, rank: u64) -> u64 {
        ((rank - 1) as u128 * self.stride as u128 % self.n as u128) as u64 + 1
    }

    /// A row id in 1..=n, drawn with the skew.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.id_of_rank(self.rank(rng))
    }

    /// h(x) = 1/x^s.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// H(x), an antiderivative of h: (x^(1-s) - 1)/(1-s), ln x at s = 1.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }
}

/// (e^x - 1)/x, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x / 2.0 * (1.0 + x / 3.0 * (1.0 + x / 4.0))
    }
}

/// ln(1 + x)/x, continuous at 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// A stride near n/φ that shares no factor with n, so that rank x stride mod n visits every id.
fn scramble_stride(n: u64) -> u64 {
    if n <= 2 {
        return 1;
    }
    let mut stride = ((n as f64 * 0.618_033_988_75) as u64).max(1);
    while gcd(stride, n) != 1 {
        stride += 1;
    }
    stride
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    /// Draw counts per rank (index 0 = rank 1).
    fn histogram(z: &Zipf, n: u64, draws: usize) -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let k = z.rank(&mut rng);
            assert!((1..=n).contains(&k), "rank {k} out of 1..={n}");
            counts[k as usize - 1] += 1;
        }
        counts
    }

    #[test]
    fn ranks_follow_the_zipf_probabilities() {
        let (n, s, draws) = (1000u64, LOOKUP_EXPONENT, 400_000);
        let z = Zipf::new(n, s).unwrap();
        let counts = histogram(&z, n, draws);
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        // The head, rank by rank, within 3 % of the exact probability.
        for k in 1..=5u64 {
            let expected = draws as f64 * (k as f64).powf(-s) / norm;
            let got = counts[k as usize - 1] as f64;
            assert!(
                (got - expected).abs() < 0.03 * expected,
                "rank {k}: {got} draws, expected {expected:.0}"
            );
        }
        // The tail as a whole: ranks 501..=1000 within 3 %.
        let tail_expected =
            draws as f64 * (501..=n).map(|k| (k as f64).powf(-s)).sum::<f64>() / norm;
        let tail: u64 = counts[500..].iter().sum();
        assert!(
            (tail as f64 - tail_expected).abs() < 0.03 * tail_expected,
            "tail {tail}, expected {tail_expected:.0}"
        );
    }

    #[test]
    fn skew_is_strong_and_every_rank_is_reachable() {
        let n = 50u64;
        let z = Zipf::new(n, LOOKUP_EXPONENT).unwrap();
        let counts = histogram(&z, n, 200_000);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        // 1/k^0.99: rank 1 drawn about 50 times as often as rank 50.
        let ratio = counts[0] as f64 / counts[49] as f64;
        assert!((40.0..60.0).contains(&ratio), "rank 1 / rank 50 = {ratio}");
    }

    #[test]
    fn one_element_and_exponent_one_work() {
        let mut rng = StdRng::seed_from_u64(1);
        let one = Zipf::new(1, LOOKUP_EXPONENT).unwrap();
        assert!((0..100).all(|_| one.sample(&mut rng) == 1));
        let harmonic = Zipf::new(10, 1.0).unwrap();
        assert!((0..1000).all(|_| (1..=10).contains(&harmonic.rank(&mut rng))));
    }

    #[test]
    fn ids_are_a_permutation_that_spreads_the_hot_ranks() {
        for n in [1u64, 2, 3, 10, 40_000, 1_000_000] {
            let z = Zipf::new(n, LOOKUP_EXPONENT).unwrap();
            let mut seen = vec![false; n as usize];
            for rank in 1..=n {
                let id = z.id_of_rank(rank);
                assert!((1..=n).contains(&id));
                assert!(!std::mem::replace(&mut seen[id as usize - 1], true));
            }
        }
        // The ten hottest rows of 40,000 (4 rows of 1000 bytes per 4 KiB page) fall on ten
        // different pages.
        let z = Zipf::new(40_000, LOOKUP_EXPONENT).unwrap();
        let mut pages: Vec<u64> = (1..=10).map(|r| z.id_of_rank(r) / 4).collect();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), 10);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Zipf::new(0, 0.99).is_err());
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = Zipf::new(10, s).unwrap_err().to_string();
            assert!(e.contains("exponent"), "{e}");
        }
    }
}
