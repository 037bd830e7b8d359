//! The simulation's only source of randomness. It is written here rather than taken from
//! `rand` because a seed must replay the same run for as long as the test exists: rand
//! documents neither its generators' streams nor its range sampling as stable across
//! releases, and a bump of the lock file must not silently turn `SEED=n` into another run.

/// xoshiro256** seeded through SplitMix64 (Blackman and Vigna), which is small, fast in
/// debug builds, and has no bad seeds.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut splitmix = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [splitmix(), splitmix(), splitmix(), splitmix()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-50 for our `n`).
    /// `n == 0` gives 0, so callers need no special case for empty ranges they guard.
    pub fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(n);
        u64::try_from(wide >> 64).unwrap_or(0)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// A signed value uniform in `lo..=hi`.
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        let span = u64::try_from(hi.saturating_sub(lo)).unwrap_or(0);
        lo.saturating_add(i64::try_from(self.range(0, span)).unwrap_or(0))
    }

    /// An index into a collection of `len` items; `len` must not be 0.
    pub fn index(&mut self, len: usize) -> usize {
        let n = u64::try_from(len).unwrap_or(u64::MAX);
        usize::try_from(self.below(n)).unwrap_or(0)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// An index chosen with the given weights; `None` when they are all zero.
    pub fn weighted(&mut self, weights: &[u32]) -> Option<usize> {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        let mut roll = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            let w = u64::from(*w);
            if roll < w {
                return Some(i);
            }
            roll -= w;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_gives_one_stream() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(Rng::new(8).next_u64(), xs[0]);
    }

    #[test]
    fn ranges_stay_inside() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            assert!(r.below(5) < 5);
            let x = r.range(3, 4);
            assert!((3..=4).contains(&x));
            let y = r.range_i64(-2, 2);
            assert!((-2..=2).contains(&y));
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.weighted(&[0, 0]), None);
        assert_eq!(r.weighted(&[0, 3]), Some(1));
    }
}
