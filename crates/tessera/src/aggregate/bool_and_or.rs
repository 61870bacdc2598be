//! BOOL_AND and BOOL_OR: the MIN and MAX of booleans taken as 0 and 1, so they share through
//! overlapping windows as MIN and MAX do. NULLs are ignored; a group without a value is NULL.

use arrow::datatypes::DataType;

use super::min_max::Extremes;
use super::{AggregateFunction, AggregateSpec, GroupStates, ValueKind};
use crate::window::Sharing;

pub(super) const BOOL_AND: BoolAndOr = BoolAndOr { name: "bool_and", or: false };
pub(super) const BOOL_OR: BoolAndOr = BoolAndOr { name: "bool_or", or: true };

#[derive(Debug)]
pub(super) struct BoolAndOr {
    name: &'static str,
    or: bool,
}

impl AggregateFunction for BoolAndOr {
    fn name(&self) -> &'static str {
        self.name
    }

    fn sharing(&self) -> Sharing {
        Sharing::CoveredBy
    }

    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        match value_type {
            Some(DataType::Boolean | DataType::Null) => Ok(ValueKind::Int),
            _ => Err("a BOOLEAN argument".into()),
        }
    }

    fn new_states(&self, _spec: &AggregateSpec) -> Box<dyn GroupStates> {
        // AND is the smallest of the values (false, 0, wins), OR the largest.
        Box::new(Extremes::new(self.or, false))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, AsArray, BooleanArray};

    use super::super::tests::spec;
    use super::*;

    #[test]
    fn and_needs_every_value_true_or_needs_one_nulls_aside() {
        let groups: [&[Option<bool>]; 5] =
            [&[Some(true), Some(true)], &[Some(true), None, Some(false)], &[None], &[Some(false), None], &[]];
        for (name, expected) in [
            ("bool_and", [Some(true), Some(false), None, Some(false), None]),
            ("bool_or", [Some(true), Some(true), None, Some(false), None]),
        ] {
            let mut spec = spec(name, Some(DataType::Boolean), None);
            spec.output_type = DataType::Boolean;
            let (values, slots): (Vec<Option<bool>>, Vec<u32>) =
                groups.iter().enumerate().flat_map(|(g, v)| v.iter().map(move |&v| (v, g as u32))).unzip();
            let column: ArrayRef = Arc::new(BooleanArray::from(values));
            let column = arrow::compute::cast(&column, &DataType::Int64).unwrap();
            let mut states = spec.new_states();
            states.resize(groups.len());
            // In two runs, the second merged into the first.
            let half = slots.len() / 2;
            let mut second = spec.new_states();
            second.resize(groups.len());
            states.update(std::slice::from_ref(&column), 0, &slots[..half]);
            second.update(std::slice::from_ref(&column), half, &slots[half..]);
            states.merge(second.as_ref(), None, &(0..groups.len() as u32).collect::<Vec<_>>()).unwrap();
            let out = spec.finalize(states.as_ref()).unwrap();
            let out: Vec<Option<bool>> = out.as_boolean().iter().collect();
            assert_eq!(out, expected, "{name}");
        }
        assert!(BOOL_AND.domain(Some(&DataType::Int64)).is_err());
    }
}
