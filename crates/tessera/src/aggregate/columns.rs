//! The loops every family of states shares: reading an argument column (or a dictionary of
//! its values) row by row into group slots, walking pairs of slots for merges, and building
//! result columns.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::datatypes::{ArrowPrimitiveType, UInt32Type};

use super::GroupStates;
use crate::error::{Result, TesseraError};

/// An argument's values: a column of them, or (a dictionary array) each row's index into them.
#[derive(Clone, Copy)]
pub(super) enum Values<'a, T> {
    Column(&'a [T]),
    Dictionary { indices: &'a [u32], values: &'a [T] },
}

/// The values of an argument of type `T`, a column of them or a dictionary array (with `UInt32`
/// keys, as readers hand them out; see [`AggregateFunction::reads_dictionaries`]).
///
/// [`AggregateFunction::reads_dictionaries`]: super::AggregateFunction::reads_dictionaries
pub(super) fn values_of<T: ArrowPrimitiveType>(array: &ArrayRef) -> Values<'_, T::Native> {
    match array.as_dictionary_opt::<UInt32Type>() {
        Some(dictionary) => Values::Dictionary {
            indices: dictionary.keys().values(),
            values: dictionary.values().as_primitive::<T>().values(),
        },
        None => Values::Column(array.as_primitive::<T>().values()),
    }
}

/// The null buffer of `array` if it has nulls.
pub(super) fn nulls_of(array: &ArrayRef) -> Option<&NullBuffer> {
    array.nulls().filter(|nulls| nulls.null_count() > 0)
}

/// Calls `f(value, slot)` for each row `offset + i` of `input` that has a value (`nulls` marks
/// those that do not), `slot` being `slots[i]`.
#[inline]
pub(super) fn each_valid<T: Copy>(
    input: Values<'_, T>,
    nulls: Option<&NullBuffer>,
    offset: usize,
    slots: &[u32],
    mut f: impl FnMut(T, usize),
) {
    match input {
        Values::Column(column) => each_valid_row(column, nulls, offset, slots, f),
        // An index of a row without a value may be any number: only the others are looked up.
        Values::Dictionary { indices, values } => {
            each_valid_row(indices, nulls, offset, slots, |index, slot| f(values[index as usize], slot))
        }
    }
}

/// [`each_valid`] over a column of `input`.
#[inline]
fn each_valid_row<T: Copy>(
    input: &[T],
    nulls: Option<&NullBuffer>,
    offset: usize,
    slots: &[u32],
    mut f: impl FnMut(T, usize),
) {
    let input = &input[offset..offset + slots.len()];
    // Values straight from memory arrive faster asked for a few chunks ahead than one cache
    // line at a time when the loop reaches them.
    const CHUNK: usize = 64;
    const AHEAD: usize = 8 * CHUNK;
    let line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    for (c, (values, slots)) in input.chunks(CHUNK).zip(slots.chunks(CHUNK)).enumerate() {
        let next = c * CHUNK + AHEAD;
        (next..next + CHUNK).step_by(line).for_each(|at| prefetch(input, at));
        match nulls {
            None => values.iter().zip(slots).for_each(|(&v, &s)| f(v, s as usize)),
            Some(nulls) => {
                let first = offset + c * CHUNK;
                for (i, (&v, &s)) in values.iter().zip(slots).enumerate() {
                    if nulls.is_valid(first + i) {
                        f(v, s as usize);
                    }
                }
            }
        }
    }
}

/// Asks the processor to bring `input[at]` into its cache, if there is such a row (a no-op on
/// processors without the hint).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn prefetch<T>(input: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(value) = input.get(at) {
        // SAFETY: SSE is part of x86-64, and a prefetch only warms the cache; the address is
        // that of a live value besides.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast()) };
    }
}

/// Calls `f(i, d)` for every pair of a slot `i` of the other states and a slot `d` of these:
/// `(j, dst[j])` for every `j`, or with `src`, `(src[j], dst[j])`. One loop per case, so a
/// merge's inner loop has no branch on which.
#[inline]
pub(super) fn each_pair(src: Option<&[u32]>, dst: &[u32], mut f: impl FnMut(usize, usize)) {
    match src {
        None => dst.iter().enumerate().for_each(|(i, &d)| f(i, d as usize)),
        Some(src) => src.iter().zip(dst).for_each(|(&i, &d)| f(i as usize, d as usize)),
    }
}

/// `other` as states of the same family as the caller's (`T`), or the error of a plan that
/// combines states of different aggregates.
pub(super) fn same<T: 'static>(other: &dyn GroupStates) -> Result<&T> {
    other
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| TesseraError::Internal("combining partial states of different aggregates".into()))
}

/// The validity of values whose `flags` say whether each has a value: none when all have.
pub(super) fn validity<F: Copy>(flags: &[F], valid: impl Fn(F) -> bool) -> Option<NullBuffer> {
    if flags.iter().all(|&f| valid(f)) {
        return None;
    }
    Some(NullBuffer::new(BooleanBuffer::collect_bool(flags.len(), |i| valid(flags[i]))))
}

/// A column of `values` with `nulls`.
pub(super) fn primitive<T: ArrowPrimitiveType>(values: Vec<T::Native>, nulls: Option<NullBuffer>) -> ArrayRef {
    Arc::new(PrimitiveArray::<T>::new(values.into(), nulls))
}

/// The error of states decoded from bytes that do not fit the plan's aggregates.
pub(super) fn mismatch() -> TesseraError {
    TesseraError::Checkpoint("the state snapshot does not match the plan's aggregates".into())
}

/// Ok when `consistent`, else [`mismatch`].
pub(super) fn check(consistent: bool) -> Result<()> {
    consistent.then_some(()).ok_or_else(mismatch)
}
