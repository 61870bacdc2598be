//! Window-set generators of the multi-window paper's evaluation (Algorithms 5 and 6), for
//! benchmarks and property tests: RandomGen (independent windows), ChainGen (each window
//! covered by the previous), StarGen (every window covered by the first) and RandomGraphGen
//! (levels of mutually uncovered windows, each covered by a random subset of the level below).
//!
//! A random window has a slide drawn from `[s_min, s_max]` (a multiple of `s_min`) and a range
//! of `k` slides, `k` in `[1, k_max]`. The *tumbling* variants draw only tumbling windows, for
//! the "partitioned by" semantics. The paper does not state `s_max` and `k_max`; the default 10
//! and 10 keep every number's prime factors at most 7, so periods stay small enough to slice.

use super::{lcm, WindowSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generator {
    Random,
    Chain,
    Star,
    RandomGraph,
}

impl Generator {
    pub const ALL: [Generator; 4] = [Generator::Random, Generator::Chain, Generator::Star, Generator::RandomGraph];

    pub fn name(self) -> &'static str {
        match self {
            Generator::Random => "RandomGen",
            Generator::Chain => "ChainGen",
            Generator::Star => "StarGen",
            Generator::RandomGraph => "RandomGraphGen",
        }
    }
}

/// A small deterministic generator (SplitMix64), so window sets are reproducible by seed.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1).max(1) as u64) as i64
    }
}

#[derive(Debug, Clone, Copy)]
pub struct GeneratorParams {
    pub s_max: i64,
    pub k_max: i64,
    pub tumbling: bool,
}

impl Default for GeneratorParams {
    fn default() -> Self {
        GeneratorParams { s_max: 10, k_max: 10, tumbling: false }
    }
}

/// Algorithm 5: a random window with a slide that is a multiple of `s_min`.
fn random_window(rng: &mut SplitMix, s_min: i64, p: &GeneratorParams) -> WindowSpec {
    let slide = s_min * rng.between(1, (p.s_max / s_min).max(1));
    if p.tumbling {
        WindowSpec::tumbling(slide)
    } else {
        WindowSpec { range: slide * rng.between(1, p.k_max), slide }
    }
}

/// A random window covered by every window of `parents` (for tumbling windows: partitioned).
fn covered_window(rng: &mut SplitMix, parents: &[WindowSpec], p: &GeneratorParams) -> WindowSpec {
    let step = parents.iter().fold(1, |acc, w| lcm(acc, w.slide));
    let slide = step * rng.between(1, 3);
    if p.tumbling {
        let base = parents.iter().fold(slide, |acc, w| lcm(acc, w.range));
        return WindowSpec::tumbling(base * rng.between(1, (p.k_max / 2).max(1)));
    }
    // The smallest range at least every parent's (and the slide) meeting every parent's
    // congruence `range = r_p (mod s_p)`, then a random number of whole common steps more.
    let floor = parents.iter().map(|w| w.range).max().unwrap_or(1).max(slide);
    let first =
        (floor..floor + step * 64).find(|r| parents.iter().all(|w| (r - w.range) % w.slide == 0)).unwrap_or(floor);
    WindowSpec { range: first + step * rng.between(0, p.k_max / 2), slide }
}

/// `count` distinct windows from `generator` (RandomGraphGen ignores `count`: 3 levels of 2, 4
/// and 6 windows, as in the paper).
pub fn generate(generator: Generator, count: usize, p: &GeneratorParams, rng: &mut SplitMix) -> Vec<WindowSpec> {
    let mut windows: Vec<WindowSpec> = Vec::new();
    let push = |windows: &mut Vec<WindowSpec>, w: WindowSpec| {
        if windows.contains(&w) {
            false
        } else {
            windows.push(w);
            true
        }
    };
    match generator {
        Generator::Random => {
            for _ in 0..count * 50 {
                if windows.len() == count {
                    break;
                }
                let w = random_window(rng, 1, p);
                push(&mut windows, w);
            }
        }
        Generator::Chain | Generator::Star => {
            windows.push(random_window(rng, 1, p));
            for _ in 0..count * 50 {
                if windows.len() == count {
                    break;
                }
                let parent = if generator == Generator::Chain { *windows.last().expect("one") } else { windows[0] };
                let w = covered_window(rng, &[parent], p);
                push(&mut windows, w);
            }
        }
        Generator::RandomGraph => {
            let mut below: Vec<WindowSpec> = Vec::new();
            for level_size in [2usize, 4, 6] {
                let mut level: Vec<WindowSpec> = Vec::new();
                for _ in 0..level_size * 50 {
                    if level.len() == level_size {
                        break;
                    }
                    let w = if below.is_empty() {
                        random_window(rng, 1, p)
                    } else {
                        let mut subset: Vec<WindowSpec> =
                            below.iter().copied().filter(|_| rng.next_u64().is_multiple_of(2)).collect();
                        if subset.is_empty() {
                            subset.push(below[rng.between(0, below.len() as i64 - 1) as usize]);
                        }
                        covered_window(rng, &subset, p)
                    };
                    let independent = level.iter().all(|o| !w.is_covered_by(o) && !o.is_covered_by(&w));
                    if independent && !windows.contains(&w) {
                        level.push(w);
                        windows.push(w);
                    }
                }
                below = level;
            }
        }
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_build_the_promised_shapes() {
        let mut rng = SplitMix::new(7);
        for tumbling in [false, true] {
            let p = GeneratorParams { tumbling, ..GeneratorParams::default() };
            for _ in 0..20 {
                let chain = generate(Generator::Chain, 5, &p, &mut rng);
                assert_eq!(chain.len(), 5);
                assert!(chain.windows(2).all(|w| w[1].is_covered_by(&w[0])), "{chain:?}");
                let star = generate(Generator::Star, 10, &p, &mut rng);
                assert_eq!(star.len(), 10);
                assert!(star[1..].iter().all(|w| w.is_covered_by(&star[0])), "{star:?}");
                let graph = generate(Generator::RandomGraph, 0, &p, &mut rng);
                assert!(graph.len() >= 6, "{graph:?}");
                let random = generate(Generator::Random, 5, &p, &mut rng);
                assert!(!random.is_empty());
                for w in chain.iter().chain(&star).chain(&graph).chain(&random) {
                    assert!(w.range >= w.slide && w.slide >= 1);
                    assert!(!tumbling || w.is_tumbling());
                }
            }
        }
    }
}
