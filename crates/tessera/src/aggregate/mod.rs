//! Aggregate functions and their mergeable partial states.
//!
//! Partial states are the currency between operators: a slice of a window keeps one
//! [`GroupStates`] per aggregate, updated in place by whole batches (`update`), combined with
//! other slices' states (`merge`), and turned into SQL values only at the output (`finalize`).
//!
//! ```text
//!  batch rows ──update(args, slots)──▶ slice states ──merge(dst slots)──▶ window states ──finalize──▶ column
//! ```
//!
//! Two traits make an aggregate: an [`AggregateFunction`] says what SQL it answers (its names,
//! the argument types it takes, how windows may share it) and makes its states; its
//! [`GroupStates`] hold one partial state per group slot, columnar, so that an update is a
//! tight loop over `(row, slot)` pairs. States that can be taken away again exactly (COUNT,
//! SUM, AVG) also implement [`InvertibleStates`], so a hopping window slides on a running value.
//!
//! One file per family; [`FUNCTIONS`] registers them. Adding an aggregate is a file with a
//! function and its states, and a line in [`FUNCTIONS`] (CONTRIBUTING.md shows one).

mod bool_and_or;
mod columns;
mod count;
mod distinct;
mod exact_sum;
mod first_last;
mod hll;
mod median;
mod min_max;
mod moments;
mod percentile;
mod sum;

use std::any::Any;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::compute::cast;
use arrow::datatypes::DataType;
use datafusion_common::ScalarValue;
use datafusion_physical_expr::PhysicalExpr;

use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};
use crate::window::Sharing;

/// Every aggregate tessera evaluates on streams, as the binder finds them by name.
pub static FUNCTIONS: &[&dyn AggregateFunction] = &[
    &min_max::MIN,
    &min_max::MAX,
    &sum::SUM,
    &sum::AVG,
    &count::COUNT,
    &count::COUNT_ROWS,
    &moments::VAR_SAMP,
    &moments::STDDEV_SAMP,
    &median::MEDIAN,
    &distinct::APPROX_COUNT_DISTINCT,
    &percentile::APPROX_PERCENTILE_CONT,
    &percentile::APPROX_MEDIAN,
    &first_last::FIRST_VALUE,
    &first_last::LAST_VALUE,
    &bool_and_or::BOOL_AND,
    &bool_and_or::BOOL_OR,
];

/// The function answering a call of DataFusion's aggregate `name` (its canonical name), with
/// `counts_rows` when the call counts rows (`COUNT(*)`, `COUNT(1)`).
pub fn lookup(name: &str, counts_rows: bool) -> Option<&'static dyn AggregateFunction> {
    FUNCTIONS.iter().copied().find(|f| f.answers(name, counts_rows))
}

/// The names of the supported aggregates, for messages.
pub fn supported_names() -> String {
    let mut names: Vec<String> = FUNCTIONS.iter().map(|f| f.name().to_ascii_uppercase()).collect();
    names.dedup();
    names.join(", ")
}

/// An aggregate function: what SQL it answers, the arguments it takes, how windows may share
/// its partial states, and the states themselves.
pub trait AggregateFunction: Send + Sync + std::fmt::Debug {
    /// The name EXPLAIN and messages show, in lower case.
    fn name(&self) -> &'static str;
    /// Whether this function evaluates a call of DataFusion's aggregate `name` (canonical),
    /// `counts_rows` telling whether the call counts rows (`COUNT(*)`): by default, a call of
    /// its own name.
    fn answers(&self, name: &str, _counts_rows: bool) -> bool {
        name == self.name()
    }
    /// How windows may share partial states (see the multi-window paper): MIN and MAX combine
    /// overlapping parts (covered by), most others need disjoint parts (partitioned by), and
    /// those without a mergeable state do not share.
    fn sharing(&self) -> Sharing;
    /// The domain the value argument is evaluated in, given its type (`None` for a function
    /// without one, as `COUNT(*)`), or what the function needs instead ("a numeric argument"),
    /// for the binder's message.
    fn domain(&self, value_type: Option<&DataType>) -> std::result::Result<ValueKind, String>;
    /// The function's parameters from the literals after the value argument (`None` where an
    /// argument is not a literal), or why they are refused.
    fn parameter(&self, literals: &[Option<ScalarValue>]) -> std::result::Result<Option<f64>, String> {
        match literals {
            [] => Ok(None),
            _ => Err("takes one argument".into()),
        }
    }
    /// Whether the function orders rows by event time (FIRST_VALUE): it then gets each row's
    /// event time as a second argument.
    fn orders_by_event_time(&self) -> bool {
        false
    }
    /// Whether states over `kind` take their argument as a dictionary array, looking each
    /// row's value up (most do; those that would materialise every value anyway do not).
    fn reads_dictionaries(&self, kind: ValueKind) -> bool {
        kind != ValueKind::Utf8
    }
    /// Whether the states implement [`InvertibleStates`] (a hopping window then slides on a
    /// running value).
    fn has_exact_inverse(&self) -> bool {
        false
    }
    /// Empty states for `spec`, a call of this function.
    fn new_states(&self, spec: &AggregateSpec) -> Box<dyn GroupStates>;
}

/// Partial states of one aggregate, one entry per group slot.
pub trait GroupStates: Send + Sync + StatesObject {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Grows (or shrinks) the states to `n` slots, new slots empty.
    fn resize(&mut self, n: usize);
    /// Adds row `offset + i` of `args` to slot `slots[i]` for every `i`: a run of consecutive
    /// rows. `args` are the call's evaluated arguments ([`AggregateSpec::evaluate_args`]):
    /// none for `COUNT(*)`, the value cast to the states' domain (a dictionary of such values
    /// where [`AggregateFunction::reads_dictionaries`] says so), then the event time for
    /// functions ordered by it. Slots must exist (see `resize`).
    fn update(&mut self, args: &[ArrayRef], offset: usize, slots: &[u32]);
    /// Merges slot `i` of `other` (states of the same aggregate) into slot `d` of these, for
    /// every pair `(i, d)` of [`each_pair`](columns::each_pair)`(src, dst)`: slot `j` into
    /// `dst[j]`, or with `src`, slot `src[j]`.
    fn merge(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32]) -> Result<()>;
    /// Appends the slots of `other`, states of the same aggregate, after these.
    fn extend_from(&mut self, other: &dyn GroupStates) -> Result<()>;
    /// Makes these states a copy of `other`, reusing their buffers; false (nothing done) when
    /// `other` is of another aggregate.
    fn copy_from(&mut self, other: &dyn GroupStates) -> bool;
    /// SQL values of every slot, in the states' domain (the caller casts to the return type).
    fn finalize(&self) -> Result<ArrayRef>;
    /// Writes the states' values (their function and domain are the plan's, not written).
    fn encode(&self, w: &mut StateWriter);
    /// Reads into these (empty) states what [`encode`](Self::encode) wrote for states of the
    /// same aggregate.
    fn decode(&mut self, r: &mut StateReader) -> Result<()>;
    /// Approximate heap bytes held, for the state-size figures.
    fn bytes(&self) -> usize;
    /// These states as ones that can be taken away exactly, if they can.
    fn invertible(&mut self) -> Option<&mut dyn InvertibleStates> {
        None
    }
}

/// What every family's states get from being `Clone` and `'static`: a boxed copy, and a
/// view as `Any` so that a merge can take states of its own family.
pub trait StatesObject {
    fn boxed_clone(&self) -> Box<dyn GroupStates>;
    fn as_any(&self) -> &dyn Any;
}

impl<T: GroupStates + Clone + 'static> StatesObject for T {
    fn boxed_clone(&self) -> Box<dyn GroupStates> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// States whose slots can be taken away again exactly: after any sequence of adding and
/// subtracting other states, they equal the remaining states merged afresh (counts and sums
/// are exact; see [`exact_sum`]).
pub trait InvertibleStates {
    /// Adds slot `i` of `other` to slot `d` of these for every pair of
    /// [`each_pair`](columns::each_pair)`(src, dst)`, or with `subtract`, takes it away.
    fn add_exactly(&mut self, other: &dyn GroupStates, src: Option<&[u32]>, dst: &[u32], subtract: bool) -> Result<()>;
}

impl Clone for Box<dyn GroupStates> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}

/// The sharing all of `functions` allow: the most restrictive of theirs.
pub fn common_sharing<'a>(functions: impl IntoIterator<Item = &'a dyn AggregateFunction>) -> Sharing {
    functions.into_iter().map(|f| f.sharing()).fold(Sharing::CoveredBy, Sharing::strictest)
}

/// The value domain a state works in; inputs are cast to it before updates and results are
/// cast back to the function's SQL return type at the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Int,
    Float,
    Utf8,
}

impl ValueKind {
    pub fn of(data_type: &DataType) -> Option<ValueKind> {
        use DataType::*;
        Some(match data_type {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Boolean | Date32 | Date64
            | Timestamp(..) | Time32(_) | Time64(_) | Duration(_) | Null => ValueKind::Int,
            Float16 | Float32 | Float64 | Decimal128(..) | Decimal256(..) => ValueKind::Float,
            Utf8 | LargeUtf8 | Utf8View => ValueKind::Utf8,
            _ => return None,
        })
    }

    pub fn arrow_type(self) -> DataType {
        match self {
            ValueKind::Int => DataType::Int64,
            ValueKind::Float => DataType::Float64,
            ValueKind::Utf8 => DataType::Utf8,
        }
    }

    /// The domain of a value of any supported type, or the message of an unsupported one.
    pub fn of_argument(value_type: Option<&DataType>) -> std::result::Result<ValueKind, String> {
        match value_type {
            None => Ok(ValueKind::Int),
            Some(t) => ValueKind::of(t).ok_or_else(|| "an argument of a number, string or time type".into()),
        }
    }

    /// The domain of a numeric argument (evaluated as `domain`), or the message of another.
    pub fn of_number(value_type: Option<&DataType>, domain: ValueKind) -> std::result::Result<ValueKind, String> {
        match value_type {
            Some(t) if t.is_numeric() || t.is_null() => Ok(domain),
            _ => Err("a numeric argument".into()),
        }
    }
}

/// Whether a hopping window of `aggregates` slides on a running value rather than on two
/// stacks: when every state can be taken away again exactly (COUNT, SUM, AVG).
pub fn slides_on_running_value(aggregates: &[AggregateSpec]) -> bool {
    aggregates.iter().all(|a| a.function.has_exact_inverse())
}

/// One aggregate of a query, bound to its arguments.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    pub function: &'static dyn AggregateFunction,
    /// The arguments evaluated on source rows: none for `COUNT(*)`, else the value, then the
    /// event time for functions ordered by it.
    pub args: Vec<Arc<dyn PhysicalExpr>>,
    /// The domain the value is cast to.
    pub kind: ValueKind,
    /// A literal parameter (APPROX_PERCENTILE_CONT's percentile).
    pub parameter: Option<f64>,
    /// The SQL return type (as DataFusion types the function).
    pub output_type: DataType,
    /// How the aggregate was written, for EXPLAIN and errors.
    pub display: String,
}

impl AggregateSpec {
    /// Evaluates and normalises the arguments over a batch: the value cast to the domain, the
    /// event time to `Int64`.
    pub fn evaluate_args(&self, batch: &arrow::record_batch::RecordBatch) -> Result<Vec<ArrayRef>> {
        let mut args = Vec::with_capacity(self.args.len());
        for (i, arg) in self.args.iter().enumerate() {
            let values = arg.evaluate(batch)?.into_array(batch.num_rows())?;
            let target = if i == 0 { self.kind.arrow_type() } else { DataType::Int64 };
            args.push(self.normalise(values, &target, i == 0)?);
        }
        Ok(args)
    }

    /// `values` as `target`; a dictionary array (as readers hand columns out) stays one where
    /// the states look each row's value up: only its entries are cast.
    fn normalise(&self, values: ArrayRef, target: &DataType, value: bool) -> Result<ArrayRef> {
        let dictionary =
            arrow::array::AsArray::as_dictionary_opt::<arrow::datatypes::UInt32Type>(&values).filter(|dictionary| {
                value && dictionary.values().null_count() == 0 && self.function.reads_dictionaries(self.kind)
            });
        if let Some(dictionary) = dictionary {
            let entries = dictionary.values();
            let entries = if entries.data_type() == target { Arc::clone(entries) } else { cast(entries, target)? };
            return Ok(Arc::new(dictionary.with_values(entries)));
        }
        Ok(if values.data_type() == target { values } else { cast(&values, target)? })
    }

    pub fn new_states(&self) -> Box<dyn GroupStates> {
        self.function.new_states(self)
    }

    /// Final values of `states` as a column of the SQL return type.
    pub fn finalize(&self, states: &dyn GroupStates) -> Result<ArrayRef> {
        let values = states.finalize().map_err(|e| match e {
            TesseraError::Execution(m) => TesseraError::Execution(format!("{}: {m}", self.display)),
            other => other,
        })?;
        if values.data_type() == &self.output_type {
            Ok(values)
        } else {
            Ok(cast(&values, &self.output_type)?)
        }
    }

    /// What the aggregate computes per row, for telling plans that can share slices apart.
    pub fn signature(&self) -> String {
        format!("{}({:?}; {:?}) as {:?}", self.function.name(), self.args, self.parameter, self.kind)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow::array::{AsArray, Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Float64Type, Int64Type};

    pub(crate) fn ints(v: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }
    pub(crate) fn floats(v: &[Option<f64>]) -> ArrayRef {
        Arc::new(Float64Array::from(v.to_vec()))
    }
    pub(crate) fn strings(v: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(v.to_vec()))
    }

    /// A call of the function named `name` over a value of `value_type` (none: `COUNT(*)`),
    /// with `parameter`; its arguments are not evaluated here (tests hand states arrays).
    pub(crate) fn spec(name: &str, value_type: Option<DataType>, parameter: Option<f64>) -> AggregateSpec {
        let function = lookup(name, value_type.is_none()).expect("a registered aggregate");
        let kind = function.domain(value_type.as_ref()).expect("a supported argument type");
        AggregateSpec {
            function,
            args: Vec::new(),
            kind,
            parameter,
            output_type: kind.arrow_type(),
            display: name.into(),
        }
    }

    /// States of `spec` over `args`, row `i` in slot `slots[i]`.
    pub(crate) fn states_of(spec: &AggregateSpec, args: &[ArrayRef], slots: &[u32]) -> Box<dyn GroupStates> {
        let mut states = spec.new_states();
        states.resize(slots.iter().max().map_or(0, |m| *m as usize + 1));
        states.update(args, 0, slots);
        states
    }

    pub(crate) fn ints_of(array: &ArrayRef) -> Vec<Option<i64>> {
        array.as_primitive::<Int64Type>().iter().collect()
    }

    pub(crate) fn floats_of(array: &ArrayRef) -> Vec<Option<f64>> {
        array.as_primitive::<Float64Type>().iter().collect()
    }

    /// `states` written and read back into fresh states of `spec`.
    pub(crate) fn round_trip(spec: &AggregateSpec, states: &dyn GroupStates) -> Box<dyn GroupStates> {
        let mut w = StateWriter::default();
        states.encode(&mut w);
        let bytes = w.into_bytes();
        let mut decoded = spec.new_states();
        let mut r = StateReader::new(&bytes);
        decoded.decode(&mut r).expect("decodes");
        r.finish().expect("reads every byte");
        decoded
    }

    #[test]
    fn sharing_follows_the_most_restrictive_aggregate() {
        let f = |name: &str| lookup(name, false).unwrap();
        assert_eq!(common_sharing([f("min"), f("max")]), Sharing::CoveredBy);
        assert_eq!(common_sharing([f("min"), f("sum")]), Sharing::PartitionedBy);
        assert_eq!(
            common_sharing([f("avg"), f("stddev_samp"), lookup("count", true).unwrap()]),
            Sharing::PartitionedBy
        );
        assert_eq!(common_sharing([f("min"), f("median")]), Sharing::None);
        assert_eq!(common_sharing([f("approx_distinct")]), Sharing::None);
        assert_eq!(common_sharing([f("bool_and"), f("max"), f("first_value")]), Sharing::CoveredBy);
        assert_eq!(common_sharing([f("approx_percentile_cont"), f("min")]), Sharing::PartitionedBy);
    }

    #[test]
    fn every_function_is_found_by_its_names_and_count_by_what_it_counts() {
        for function in FUNCTIONS {
            let counts_rows = function.name() == "count" && function.domain(None).is_ok();
            let found = lookup(function.name(), counts_rows).map(|f| std::ptr::addr_eq(f, *function));
            assert_eq!(found, Some(true), "{}", function.name());
        }
        assert_eq!(lookup("count", true).unwrap().domain(None), Ok(ValueKind::Int));
        assert!(lookup("count", false).unwrap().domain(None).is_err());
        assert!(lookup("string_agg", false).is_none());
    }

    /// Every family: appended states finalize as the concatenation of their parts, survive
    /// the codec, copy, and refuse to combine with another family's states.
    #[test]
    fn appended_states_finalize_as_the_concatenated_values() {
        let values = floats(&[Some(2.5), None, Some(-1.0), Some(4.0), Some(4.0)]);
        let times = ints(&[Some(3), Some(1), Some(2), Some(2), Some(5)]);
        let booleans = ints(&[Some(1), None, Some(0), Some(1), Some(1)]);
        for function in FUNCTIONS {
            let (value_type, args): (Option<DataType>, Vec<ArrayRef>) = match function.name() {
                "count" if function.domain(None).is_ok() => (None, vec![]),
                "bool_and" | "bool_or" => (Some(DataType::Boolean), vec![Arc::clone(&booleans)]),
                "first_value" | "last_value" => {
                    (Some(DataType::Float64), vec![Arc::clone(&values), Arc::clone(&times)])
                }
                _ => (Some(DataType::Float64), vec![Arc::clone(&values)]),
            };
            let spec = spec(function.name(), value_type, (function.name() == "approx_percentile_cont").then_some(0.3));
            let states = |slots: &[u32]| {
                let mut s = spec.new_states();
                s.resize(3);
                s.update(&args, 0, slots);
                s
            };
            let (first, second) = (states(&[0, 1, 0, 2, 2]), states(&[2, 2, 1, 1, 0]));
            let mut appended = first.clone();
            appended.extend_from(second.as_ref()).unwrap();
            assert_eq!(appended.len(), 6);
            let parts = [first.finalize().unwrap(), second.finalize().unwrap()];
            let expected = arrow::compute::concat(&[parts[0].as_ref(), parts[1].as_ref()]).unwrap();
            let name = function.name();
            assert_eq!(appended.finalize().unwrap().as_ref(), expected.as_ref(), "{name}");
            let decoded = round_trip(&spec, appended.as_ref());
            assert_eq!(decoded.finalize().unwrap().as_ref(), expected.as_ref(), "{name} through the codec");
            let mut copy = spec.new_states();
            assert!(copy.copy_from(appended.as_ref()), "{name}");
            assert_eq!(copy.finalize().unwrap().as_ref(), expected.as_ref(), "{name} copied");
            assert!(copy.bytes() > 0, "{name}");
            let other: Box<dyn GroupStates> = if name == "median" {
                self::spec("min", Some(DataType::Float64), None).new_states()
            } else {
                self::spec("median", Some(DataType::Float64), None).new_states()
            };
            assert!(copy.extend_from(other.as_ref()).is_err(), "{name}");
            assert!(copy.merge(other.as_ref(), None, &[]).is_err(), "{name}");
            assert!(!copy.copy_from(other.as_ref()), "{name}");
        }
    }

    #[test]
    fn nulls_are_ignored_and_empty_groups_are_null() {
        let v = ints(&[Some(3), None, Some(1), None]);
        let slots = [0, 0, 0, 1];
        let int = Some(DataType::Int64);
        let out = |name: &str, args: &[ArrayRef]| {
            let spec = spec(name, if args.is_empty() { None } else { int.clone() }, None);
            states_of(&spec, args, &slots).finalize().unwrap()
        };
        assert_eq!(ints_of(&out("min", std::slice::from_ref(&v))), vec![Some(1), None]);
        assert_eq!(ints_of(&out("sum", std::slice::from_ref(&v))), vec![Some(4), None]);
        assert_eq!(ints_of(&out("count", &[v])), vec![Some(2), Some(0)]);
        assert_eq!(ints_of(&out("count", &[])), vec![Some(3), Some(1)]);
    }

    #[test]
    fn dictionary_arguments_aggregate_as_their_values() {
        use arrow::array::DictionaryArray;
        // Rows as dictionary entries (NULL: a NULL row; entry 3 is never used), in runs that
        // start past the first row.
        let entries: Vec<Option<u32>> = (0..40).map(|i| (i % 7 != 2).then_some(i * 5 % 3)).collect();
        let slots: Vec<u32> = (0..40).map(|i| i * 3 % 4).collect();
        for (value_type, dictionary) in [
            (DataType::Float64, floats(&[Some(2.5), Some(-1.0), Some(-0.0), Some(9.0)])),
            (DataType::Int64, ints(&[Some(7), Some(-1 << 40), Some(-3), Some(1)])),
        ] {
            let keys = arrow::array::UInt32Array::from(entries.clone());
            let plain = arrow::compute::take(&dictionary, &keys, None).unwrap();
            let looked_up: ArrayRef = Arc::new(DictionaryArray::try_new(keys, dictionary).unwrap());
            for name in ["min", "max", "sum", "count", "avg", "var_samp", "median", "approx_percentile_cont"] {
                let spec = spec(name, Some(value_type.clone()), Some(0.4));
                if spec.kind != ValueKind::of(&value_type).unwrap() {
                    continue; // variances and medians take integers as floats
                }
                assert!(spec.function.reads_dictionaries(spec.kind), "{name}");
                let states = |values: &ArrayRef| {
                    let mut s = spec.new_states();
                    s.resize(4);
                    s.update(std::slice::from_ref(values), 3, &slots[3..25]);
                    s.update(std::slice::from_ref(values), 25, &slots[25..]);
                    s.finalize().unwrap()
                };
                assert_eq!(states(&looked_up).as_ref(), states(&plain).as_ref(), "{name} over {value_type}");
            }
        }
        assert!(!lookup("approx_distinct", false).unwrap().reads_dictionaries(ValueKind::Int));
        assert!(!lookup("min", false).unwrap().reads_dictionaries(ValueKind::Utf8));
    }

    #[test]
    fn strings_keep_their_order_through_min_max_and_first_last() {
        let v = strings(&[Some("pear"), None, Some("apple"), Some("zebra")]);
        let t = ints(&[Some(2), Some(1), Some(3), Some(0)]);
        let text = Some(DataType::Utf8);
        let out = |name: &str, args: &[ArrayRef]| {
            let finalized = states_of(&spec(name, text.clone(), None), args, &[0, 0, 0, 0]).finalize().unwrap();
            finalized.as_string::<i32>().iter().map(|s| s.map(str::to_string)).collect::<Vec<_>>()
        };
        assert_eq!(out("min", std::slice::from_ref(&v)), [Some("apple".to_string())]);
        assert_eq!(out("max", std::slice::from_ref(&v)), [Some("zebra".to_string())]);
        assert_eq!(out("first_value", &[v.clone(), t.clone()]), [Some("zebra".to_string())]);
        assert_eq!(out("last_value", &[v, t]), [Some("apple".to_string())]);
    }
}
