//! Exact float sums, rounded once: every plan gives the same bits.
//!
//! A float SUM merged from partial sums in different orders (slices, sub-windows, workers,
//! key groups read back from disk) rounds differently in each: `2075.32` against
//! `2075.3199999999997`. [`ExactSums`] keeps every slot's sum exactly and rounds it to the
//! nearest double (ties to even) only when the value is read, so the result is the correctly
//! rounded sum of the inputs whatever the order of additions, subtractions and merges.
//!
//! A double is an integer `m` below 2^53 times `2^p`. A slot holds its sum as `mantissa *
//! 2^exponent` with a 128-bit mantissa and the smallest exponent of the values it took: sums
//! of values spanning up to about 2^70 in magnitude (say 10^-6 to 10^15) stay in these 18
//! bytes, and an addition costs a shift and an add. A slot whose sum does not fit (values
//! spanning more, or not finite) moves to a [`WideSum`]: a two's-complement fixed-point
//! integer in units of 2^-1074 (the least subnormal) wide enough for any double's every bit,
//! with counts of infinities and NaNs, so it too is exact and can be taken away again.
//! Infinities and NaNs follow IEEE 754: NaN if any NaN or infinities of both signs, else the
//! infinity; a finite sum beyond the largest double rounds to infinity. An exact zero is +0.0.

use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};

/// The exponent marking a slot whose sum is the [`WideSum`] its mantissa indexes.
const WIDE: i16 = i16::MIN;

/// The exponent of the least subnormal double: every double is a whole multiple of 2^-1074.
const LEAST_EXPONENT: i32 = -1074;

/// Limbs of a [`WideSum`]: a double is below 2^1024, a 128-bit mantissa's sum below 2^(127 +
/// 971); in units of 2^-1074 that is below 2^2172, leaving 131 bits for carries and sign.
const LIMBS: usize = 36;

/// Exact sums of doubles, one per slot.
#[derive(Debug, Default, PartialEq)]
pub struct ExactSums {
    /// The sum of slot `i` is `mantissas[i] * 2^exponents[i]`, or, with exponent [`WIDE`],
    /// `wide[mantissas[i]]`.
    mantissas: Vec<i128>,
    exponents: Vec<i16>,
    wide: Vec<WideSum>,
}

impl Clone for ExactSums {
    fn clone(&self) -> Self {
        ExactSums { mantissas: self.mantissas.clone(), exponents: self.exponents.clone(), wide: self.wide.clone() }
    }

    /// Reuses the buffers (a table copies a window's states for every instance it emits).
    fn clone_from(&mut self, other: &Self) {
        self.mantissas.clone_from(&other.mantissas);
        self.exponents.clone_from(&other.exponents);
        self.wide.clone_from(&other.wide);
    }
}

impl ExactSums {
    pub fn len(&self) -> usize {
        self.mantissas.len()
    }

    /// Grows (or cuts) to `n` slots, new slots zero.
    pub fn resize(&mut self, n: usize) {
        self.mantissas.resize(n, 0);
        self.exponents.resize(n, 0);
    }

    /// Appends the slots of `other` after these.
    pub fn extend_from(&mut self, other: &ExactSums) {
        let offset = self.wide.len() as i128;
        self.mantissas.extend(
            other.mantissas.iter().zip(&other.exponents).map(|(&m, &e)| if e == WIDE { m + offset } else { m }),
        );
        self.exponents.extend_from_slice(&other.exponents);
        self.wide.extend_from_slice(&other.wide);
    }

    /// Adds `value` to slot `slot`.
    #[inline(always)]
    pub fn add(&mut self, slot: usize, value: f64) {
        match decompose(value) {
            Some((0, _)) => {}
            Some((mantissa, exponent)) => self.add_scaled(slot, mantissa, exponent),
            None => {
                let wide = self.widen(slot);
                wide.add_special(value, 1);
            }
        }
    }

    /// Adds slot `from` of `other` to slot `slot` of these, or takes it away (`subtract`).
    pub fn add_slot(&mut self, slot: usize, other: &ExactSums, from: usize, subtract: bool) {
        let (mantissa, exponent) = (other.mantissas[from], other.exponents[from]);
        if exponent != WIDE {
            // A mantissa of -2^127 has no negation; halving it first keeps it exact.
            let (mantissa, exponent) = match (subtract, mantissa.checked_neg()) {
                (false, _) => (mantissa, exponent),
                (true, Some(negated)) => (negated, exponent),
                (true, None) => (1i128 << 126, exponent + 1),
            };
            if mantissa != 0 {
                self.add_scaled(slot, mantissa, exponent);
            }
            return;
        }
        let theirs = &other.wide[mantissa as usize];
        self.widen(slot).add_wide(theirs, subtract);
    }

    /// Slot `slot`'s sum, rounded to the nearest double (ties to even).
    pub fn value(&self, slot: usize) -> f64 {
        let (mantissa, exponent) = (self.mantissas[slot], self.exponents[slot]);
        if exponent == WIDE {
            return self.wide[mantissa as usize].value();
        }
        let magnitude = mantissa.unsigned_abs();
        let cut = (128 - magnitude.leading_zeros()).saturating_sub(63);
        let top = (magnitude >> cut) as u64 | u64::from(magnitude & ((1u128 << cut) - 1) != 0);
        round_scaled(top, cut as i32 + i32::from(exponent), mantissa < 0)
    }

    /// Approximate heap bytes held.
    pub fn bytes(&self) -> usize {
        self.mantissas.capacity() * 18 + self.wide.capacity() * std::mem::size_of::<WideSum>()
    }

    pub fn encode(&self, w: &mut StateWriter) {
        w.i128s(&self.mantissas);
        w.i64s(&self.exponents.iter().map(|&e| i64::from(e)).collect::<Vec<_>>());
        w.len(self.wide.len());
        for wide in &self.wide {
            w.u64s(wide.limbs.iter().copied());
            w.i64s(&wide.specials);
        }
    }

    pub fn decode(r: &mut StateReader) -> Result<Self> {
        let corrupt = || TesseraError::Checkpoint("a saved float sum is inconsistent".into());
        let mantissas = r.i128s()?;
        let exponents =
            r.i64s()?.into_iter().map(|e| i16::try_from(e).map_err(|_| corrupt())).collect::<Result<Vec<_>>>()?;
        let wide = (0..r.len(8 * LIMBS)?)
            .map(|_| {
                let limbs: [u64; LIMBS] = r.u64s()?.try_into().map_err(|_| corrupt())?;
                let specials: [i64; 3] = r.i64s()?.try_into().map_err(|_| corrupt())?;
                Ok(WideSum { limbs, specials })
            })
            .collect::<Result<Vec<_>>>()?;
        let sums = ExactSums { mantissas, exponents, wide };
        let valid = sums.mantissas.len() == sums.exponents.len()
            && sums.mantissas.iter().zip(&sums.exponents).all(|(&m, &e)| match e {
                WIDE => usize::try_from(m).is_ok_and(|i| i < sums.wide.len()),
                e => i32::from(e) >= LEAST_EXPONENT,
            });
        valid.then_some(sums).ok_or_else(corrupt)
    }

    /// Adds `mantissa * 2^exponent` (not zero) to slot `slot`.
    #[inline(always)]
    fn add_scaled(&mut self, slot: usize, mantissa: i128, exponent: i16) {
        let (mine, my_exponent) = (self.mantissas[slot], self.exponents[slot]);
        // The common case: a value of the binade the sum is kept in.
        if exponent == my_exponent {
            if let Some(sum) = mine.checked_add(mantissa) {
                self.mantissas[slot] = sum;
                return;
            }
        }
        self.add_shifted(slot, mantissa, exponent);
    }

    /// [`add_scaled`](Self::add_scaled) for a value of another binade than the sum's.
    fn add_shifted(&mut self, slot: usize, mantissa: i128, exponent: i16) {
        let (mine, my_exponent) = (self.mantissas[slot], self.exponents[slot]);
        if my_exponent != WIDE {
            if mine == 0 {
                (self.mantissas[slot], self.exponents[slot]) = (mantissa, exponent);
                return;
            }
            // Both on the smaller exponent, then added: exact while everything fits.
            let (low, high, high_exponent, low_exponent) = if exponent >= my_exponent {
                (mine, mantissa, exponent, my_exponent)
            } else {
                (mantissa, mine, my_exponent, exponent)
            };
            if let Some(sum) = shift_left(high, (high_exponent - low_exponent) as u32).and_then(|h| h.checked_add(low))
            {
                (self.mantissas[slot], self.exponents[slot]) = (sum, low_exponent);
                return;
            }
        }
        self.widen(slot).add_scaled(mantissa, exponent, false);
    }

    /// Slot `slot` as a wide sum (moved there if it was not).
    fn widen(&mut self, slot: usize) -> &mut WideSum {
        if self.exponents[slot] != WIDE {
            let mut wide = WideSum::default();
            if self.mantissas[slot] != 0 {
                wide.add_scaled(self.mantissas[slot], self.exponents[slot], false);
            }
            self.wide.push(wide);
            (self.mantissas[slot], self.exponents[slot]) = ((self.wide.len() - 1) as i128, WIDE);
        }
        &mut self.wide[self.mantissas[slot] as usize]
    }
}

/// A sum of any doubles, exactly: finite ones as a two's-complement integer of 2^-1074 units,
/// infinities and NaNs counted.
#[derive(Debug, Clone, PartialEq)]
struct WideSum {
    /// Little-endian limbs.
    limbs: [u64; LIMBS],
    /// How many +inf, -inf and NaN values.
    specials: [i64; 3],
}

impl Default for WideSum {
    fn default() -> Self {
        WideSum { limbs: [0; LIMBS], specials: [0; 3] }
    }
}

impl WideSum {
    /// Adds (or takes away) `mantissa * 2^exponent`, `exponent` at least -1074.
    fn add_scaled(&mut self, mantissa: i128, exponent: i16, subtract: bool) {
        let shift = (i32::from(exponent) - LEAST_EXPONENT) as u32;
        let (limb, bit) = ((shift / 64) as usize, shift % 64);
        let magnitude = mantissa.unsigned_abs();
        // The magnitude shifted into three limbs.
        let parts = [
            (magnitude << bit) as u64,
            ((magnitude << bit) >> 64) as u64,
            if bit == 0 { 0 } else { (magnitude >> (128 - bit)) as u64 },
        ];
        let negative = (mantissa < 0) != subtract;
        let mut carry = false;
        for (i, target) in self.limbs[limb..].iter_mut().enumerate() {
            if i >= parts.len() && !carry {
                break;
            }
            carry = add_limb(target, parts.get(i).copied().unwrap_or(0), carry, negative);
        }
    }

    /// Counts a NaN or an infinity `times` times (negative: takes them away).
    fn add_special(&mut self, value: f64, times: i64) {
        let kind = if value.is_nan() {
            2
        } else if value > 0.0 {
            0
        } else {
            1
        };
        self.specials[kind] += times;
    }

    /// Adds (or takes away) another wide sum.
    fn add_wide(&mut self, other: &WideSum, subtract: bool) {
        let mut carry = false;
        for (mine, &theirs) in self.limbs.iter_mut().zip(&other.limbs) {
            carry = add_limb(mine, theirs, carry, subtract);
        }
        let sign = if subtract { -1 } else { 1 };
        for (mine, &theirs) in self.specials.iter_mut().zip(&other.specials) {
            *mine += sign * theirs;
        }
    }

    fn value(&self) -> f64 {
        let [pos_inf, neg_inf, nan] = self.specials;
        if nan > 0 || (pos_inf > 0 && neg_inf > 0) {
            return f64::NAN;
        }
        if pos_inf > 0 {
            return f64::INFINITY;
        }
        if neg_inf > 0 {
            return f64::NEG_INFINITY;
        }
        let negative = self.limbs[LIMBS - 1] >> 63 == 1;
        let mut magnitude = self.limbs;
        if negative {
            // Two's complement: invert and add one.
            let mut carry = true;
            for limb in &mut magnitude {
                let (v, c) = (!*limb).overflowing_add(u64::from(carry));
                (*limb, carry) = (v, c);
            }
        }
        let Some(top_limb) = magnitude.iter().rposition(|&l| l != 0) else { return 0.0 };
        let top_bit = top_limb as u32 * 64 + 63 - magnitude[top_limb].leading_zeros();
        let cut = top_bit.saturating_sub(62);
        // Bits cut..cut+63 of the magnitude, and whether any below them is set.
        let bit = |i: u32| magnitude[(i / 64) as usize] >> (i % 64) & 1;
        let top = (cut..=top_bit).rev().fold(0u64, |acc, i| acc << 1 | bit(i));
        let (whole, part) = ((cut / 64) as usize, cut % 64);
        let sticky = magnitude[..whole].iter().any(|&l| l != 0) || magnitude[whole] & ((1u64 << part) - 1) != 0;
        round_scaled(top | u64::from(sticky), cut as i32 + LEAST_EXPONENT, negative)
    }
}

/// Adds `part` and the carry in to `limb` (or, `subtract`, takes them away); the carry (or
/// borrow) out.
fn add_limb(limb: &mut u64, part: u64, carry: bool, subtract: bool) -> bool {
    let (value, first, second) = if subtract {
        let (d, b1) = limb.overflowing_sub(part);
        let (d, b2) = d.overflowing_sub(u64::from(carry));
        (d, b1, b2)
    } else {
        let (s, c1) = limb.overflowing_add(part);
        let (s, c2) = s.overflowing_add(u64::from(carry));
        (s, c1, c2)
    };
    *limb = value;
    first || second
}

/// `value` as `mantissa * 2^exponent`, the mantissa below 2^53 and the exponent that of its
/// binade (so that values of one binade add without a shift), `None` for NaN and infinities.
#[inline(always)]
fn decompose(value: f64) -> Option<(i128, i16)> {
    let bits = value.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0x7ff {
        return None;
    }
    let fraction = bits & ((1 << 52) - 1);
    // Subnormals have no implicit bit.
    let (mantissa, exponent) =
        if biased == 0 { (fraction, LEAST_EXPONENT) } else { (fraction | 1 << 52, biased - 1075) };
    let mantissa = i128::from(mantissa);
    Some((if bits >> 63 == 1 { -mantissa } else { mantissa }, exponent as i16))
}

/// `value << shift`, if it fits in an i128 with its sign.
#[inline]
fn shift_left(value: i128, shift: u32) -> Option<i128> {
    (value.unsigned_abs().leading_zeros() > shift).then(|| value << shift)
}

/// `±top * 2^exponent` as the nearest double, `top` below 2^63 with its last bit set if any
/// bit cut below it was (that bit lies below the rounding position, so the hardware's
/// conversion rounds as if it had seen them all). The conversion rounds once; scaling by a
/// power of two is then exact, except into the subnormals, where (as the sum is a whole number
/// of 2^-1074 and `top` was not cut) the value is representable and scaled exactly as well.
fn round_scaled(top: u64, exponent: i32, negative: bool) -> f64 {
    let power = |k: i32| f64::from_bits(((k + 1023) as u64) << 52);
    let magnitude = top as f64;
    let value = if top == 0 {
        0.0
    } else if exponent > 1023 {
        f64::INFINITY
    } else if exponent >= -1022 {
        magnitude * power(exponent)
    } else {
        magnitude * power(exponent + 100) * power(-100)
    };
    if negative {
        -value
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    /// The exact sum of `values` as a decimal (every double is a whole number of 10^-1100),
    /// rounded by the standard library's parser, which rounds correctly: independent of the
    /// code above but for splitting a double into its mantissa and exponent.
    fn reference(values: &[f64]) -> f64 {
        let specials: Vec<f64> = values.iter().copied().filter(|v| !v.is_finite()).collect();
        if !specials.is_empty() {
            return specials.iter().sum();
        }
        // Sum as a big decimal: value = m * 2^e, accumulated as an exact decimal string.
        let mut total = BigDecimal::zero();
        for &v in values {
            total.add(&BigDecimal::from_f64(v));
        }
        total.scientific().parse().unwrap()
    }

    /// A tiny exact decimal: digits (little-endian base 10^9 limbs) times 10^-1100, signed.
    struct BigDecimal {
        negative: bool,
        limbs: Vec<u64>,
    }

    const BASE: u64 = 1_000_000_000;
    const SCALE: u32 = 1100;

    impl BigDecimal {
        fn zero() -> Self {
            BigDecimal { negative: false, limbs: vec![] }
        }

        /// `v` times 10^1100 is an integer: m * 2^e * 10^1100 = m * 5^1100 * 2^(e + 1100).
        fn from_f64(v: f64) -> Self {
            let (m, e) = decompose(v).unwrap();
            let m = m.unsigned_abs() as u64;
            let mut limbs = vec![m % BASE, m / BASE % BASE, m / BASE / BASE];
            // Multiplies by `factor^power` in steps whose products fit in 64 bits.
            let scale = |limbs: &mut Vec<u64>, factor: u64, mut power: u32| {
                while power > 0 {
                    let step = power.min(if factor == 5 { 12 } else { 29 });
                    power -= step;
                    let k = factor.pow(step);
                    let mut carry = 0;
                    for l in limbs.iter_mut() {
                        let x = *l * k + carry;
                        *l = x % BASE;
                        carry = x / BASE;
                    }
                    while carry > 0 {
                        limbs.push(carry % BASE);
                        carry /= BASE;
                    }
                }
            };
            scale(&mut limbs, 5, SCALE);
            scale(&mut limbs, 2, u32::try_from(i32::from(e) + SCALE as i32).unwrap());
            BigDecimal { negative: v < 0.0, limbs }
        }

        fn cmp_magnitude(a: &[u64], b: &[u64]) -> std::cmp::Ordering {
            let trim = |x: &[u64]| x.len() - x.iter().rev().take_while(|&&l| l == 0).count();
            let (la, lb) = (trim(a), trim(b));
            la.cmp(&lb).then_with(|| a[..la].iter().rev().cmp(b[..lb].iter().rev()))
        }

        fn add(&mut self, other: &BigDecimal) {
            let n = self.limbs.len().max(other.limbs.len()) + 1;
            let (mut a, mut b) = (self.limbs.clone(), other.limbs.clone());
            a.resize(n, 0);
            b.resize(n, 0);
            if self.negative == other.negative {
                let mut carry = 0;
                for (x, y) in a.iter_mut().zip(&b) {
                    let s = *x + y + carry;
                    *x = s % BASE;
                    carry = s / BASE;
                }
                self.limbs = a;
                return;
            }
            let (big, small, negative) =
                if Self::cmp_magnitude(&a, &b).is_ge() { (a, b, self.negative) } else { (b, a, other.negative) };
            let mut out = big.clone();
            let mut borrow = 0i64;
            for (x, y) in out.iter_mut().zip(&small) {
                let mut d = *x as i64 - *y as i64 - borrow;
                borrow = i64::from(d < 0);
                if d < 0 {
                    d += BASE as i64;
                }
                *x = d as u64;
            }
            self.limbs = out;
            self.negative = negative;
        }

        fn scientific(&self) -> String {
            let mut digits: String = self.limbs.iter().rev().map(|l| format!("{l:09}")).collect();
            digits = digits.trim_start_matches('0').to_string();
            if digits.is_empty() {
                return "0".into();
            }
            format!("{}{}e-{SCALE}", if self.negative { "-" } else { "" }, digits)
        }
    }

    fn exact_sum(values: &[f64]) -> f64 {
        let mut sums = ExactSums::default();
        sums.resize(1);
        values.iter().for_each(|&v| sums.add(0, v));
        sums.value(0)
    }

    fn assert_same(actual: f64, expected: f64, values: &[f64]) {
        assert!(
            actual.to_bits() == expected.to_bits() || (actual.is_nan() && expected.is_nan()),
            "{actual:e} != {expected:e} for {values:?}"
        );
    }

    #[test]
    fn sums_are_correctly_rounded() {
        let cases: &[&[f64]] = &[
            &[0.1, 0.2, 0.3],
            &[1e308, 1e308, -1e308],
            &[1e308, 1e308],
            &[f64::MAX, f64::MAX * 2f64.powi(-53)],
            &[f64::MAX, f64::MAX * 2f64.powi(-54)],
            &[1.0, 1e-300, -1.0],
            &[5e-324, 5e-324, 1e-310],
            &[1e100, 1.0, -1e100, 1e-100],
            &[-0.0, -0.0],
            &[0.1; 10],
            &[2075.32, -0.01, 1e-17, 3.5e15],
            &[f64::INFINITY, 1.0],
            &[f64::INFINITY, f64::NEG_INFINITY],
            &[f64::NAN, 1.0],
            &[f64::MIN_POSITIVE, -5e-324],
            // Just above half an ulp of 1.0: rounds up only if the bits far below count.
            &[1.0, 1.1102230246251565e-16, 7.888609052210118e-31],
            &[1e300, 1.0, 1.1102230246251565e-16, 7.888609052210118e-31, -1e300],
            &[-1.0, -1.1102230246251565e-16, -7.888609052210118e-31],
        ];
        for values in cases {
            assert_same(exact_sum(values), reference(values), values);
        }
        assert_eq!(exact_sum(&[-0.0]).to_bits(), 0.0f64.to_bits(), "an exact zero is +0.0");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        #[test]
        fn every_order_and_grouping_gives_the_correctly_rounded_sum(
            values in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO,
                    (-1e6f64..1e6),
                    (-1000i32..1000).prop_map(|c| f64::from(c) / 100.0),
                ],
                0..40,
            ),
            split in 0usize..40,
            seed in 0u64..1000,
        ) {
            let expected = reference(&values);
            // In order, and reversed.
            assert_same(exact_sum(&values), expected, &values);
            let reversed: Vec<f64> = values.iter().rev().copied().collect();
            assert_same(exact_sum(&reversed), expected, &values);
            // Two partial sums merged, a third added and taken away, through the codec.
            let split = split.min(values.len());
            let mut parts = ExactSums::default();
            parts.resize(3);
            values[..split].iter().for_each(|&v| parts.add(0, v));
            values[split..].iter().for_each(|&v| parts.add(1, v));
            values.iter().for_each(|&v| parts.add(2, v * (seed as f64)));
            let mut w = StateWriter::default();
            parts.encode(&mut w);
            let bytes = w.into_bytes();
            let parts = ExactSums::decode(&mut StateReader::new(&bytes)).unwrap();
            let mut total = ExactSums::default();
            total.resize(1);
            total.add_slot(0, &parts, 2, false);
            total.add_slot(0, &parts, 1, false);
            total.add_slot(0, &parts, 0, false);
            total.add_slot(0, &parts, 2, true);
            assert_same(total.value(0), expected, &values);
        }
    }

    #[test]
    fn appended_slots_keep_their_wide_sums() {
        let mut a = ExactSums::default();
        a.resize(2);
        a.add(1, 1e300);
        a.add(1, 1e-300);
        let mut b = a.clone();
        b.add(0, f64::INFINITY);
        a.extend_from(&b);
        assert_eq!(a.len(), 4);
        assert_eq!(a.value(1), 1e300);
        assert_eq!(a.value(2), f64::INFINITY);
        assert_eq!(a.value(3), 1e300);
        a.add_slot(1, &a.clone(), 3, true);
        assert_eq!(a.value(1), 0.0);
    }
}
