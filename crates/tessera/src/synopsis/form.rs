//! A count as it continues through instants without events: the value at an anchor instant
//! `u`, the values at the next few instants, and a line from there on. Every count a synopsis
//! keeps is stored this way, anchored at the last instant its partition had events, so an
//! instant anywhere after it is read in constant time and empty instants are never visited.
//!
//! ```text
//!  value(u)      value(u+1) .. value(u+k)      value(u+k+1+x) = a + b·x   (x ≥ 0)
//!  `now`         `next`                         `tail` = Some((a, b))
//! ```
//!
//! Counts are `u128` (see [`Count`]); arithmetic that would overflow is an error, never a wrap.
//! A tail is `None` where the count stops following a line (a difference of two counts that
//! grow at different rates): such a count is only read where it is known, and the compiler
//! refuses formulas that would store one (see `formula::Growth`).

/// A line `a + b·x`, as `(a, b)`.
type Line = (Count, Count);

/// A number of duplicates. 128 bits: a product of three counts of 10^12 events still fits.
pub type Count = u128;

/// Why a count could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormError {
    /// The count does not fit in 128 bits.
    Overflow,
    /// The count stops following a line before the instant asked for.
    Unknown,
}

/// A count from an anchor instant on, through instants without events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Form {
    pub now: Count,
    pub next: Vec<Count>,
    pub tail: Option<(Count, Count)>,
}

fn add(a: Count, b: Count) -> Result<Count, FormError> {
    a.checked_add(b).ok_or(FormError::Overflow)
}

fn mul(a: Count, b: Count) -> Result<Count, FormError> {
    a.checked_mul(b).ok_or(FormError::Overflow)
}

/// The binary operations of the duplicate semantics (Figure 1 of the paper).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// Disjunction and projection: counts add.
    Sum,
    /// Conjunction: counts multiply.
    Product,
    /// `Q1 AND NOT Q2`: `max(0, m - n)`.
    Monus,
}

/// The unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    /// `DISTINCT`: 1 where the count is positive.
    Distinct,
    /// `NOT Q` (that is `TRUE AND NOT Q`): 1 where the count is 0.
    Not,
}

impl Binary {
    fn value(self, m: Count, n: Count) -> Result<Count, FormError> {
        match self {
            Binary::Sum => add(m, n),
            Binary::Product => mul(m, n),
            Binary::Monus => Ok(m.saturating_sub(n)),
        }
    }

    /// The line of the result where the operands follow `(a, b)` and `(c, d)`, both with a
    /// positive first term wherever their slope is positive (see [`Form::aligned`]).
    fn line(self, (a, b): (Count, Count), (c, d): (Count, Count)) -> Result<Option<(Count, Count)>, FormError> {
        Ok(match self {
            Binary::Sum => Some((add(a, c)?, add(b, d)?)),
            // (a + bx)(c + dx) is a line when one of them is constant.
            Binary::Product if b == 0 || d == 0 => Some((mul(a, c)?, add(mul(a, d)?, mul(b, c)?)?)),
            Binary::Product => None,
            // The difference starts at a - c and moves by b - d: it stays on one side of 0 when
            // it starts there and moves away (or not at all).
            Binary::Monus if a >= c && b >= d => Some((a - c, b - d)),
            Binary::Monus if a <= c && b <= d => Some((0, 0)),
            Binary::Monus => None,
        })
    }
}

impl Unary {
    fn value(self, m: Count) -> Count {
        match self {
            Unary::Distinct => Count::from(m > 0),
            Unary::Not => Count::from(m == 0),
        }
    }
}

impl Form {
    pub fn zero() -> Self {
        Form::constant(0)
    }

    /// The same count at every instant (`TRUE`: 1).
    pub fn constant(c: Count) -> Self {
        Form { now: c, next: Vec::new(), tail: Some((c, 0)) }
    }

    /// `c` at the anchor and 0 after it: the events of one instant.
    pub fn event(c: Count) -> Self {
        Form { now: c, next: Vec::new(), tail: Some((0, 0)) }
    }

    pub fn is_zero(&self) -> bool {
        self.now == 0 && self.next.iter().all(|&v| v == 0) && self.tail == Some((0, 0))
    }

    /// The count `j` instants after the anchor.
    pub fn at(&self, j: u128) -> Result<Count, FormError> {
        if j == 0 {
            return Ok(self.now);
        }
        let k = self.next.len() as u128;
        if j <= k {
            return Ok(self.next[(j - 1) as usize]);
        }
        let (a, b) = self.tail.ok_or(FormError::Unknown)?;
        add(a, mul(b, j - k - 1)?)
    }

    /// The line from `k + 1` instants after the anchor on (`k` at least the length of `next`).
    fn line_from(&self, k: usize) -> Result<Option<(Count, Count)>, FormError> {
        let Some((a, b)) = self.tail else { return Ok(None) };
        Ok(Some((add(a, mul(b, (k - self.next.len()) as u128)?)?, b)))
    }

    /// Values at the next `k` instants (as far as known) and the line after them, with `k` at
    /// least one more than `next` holds: the line then starts at a term where a positive slope
    /// has made it positive, so the sign of every later term is that of the first.
    fn aligned(&self, k: usize) -> Result<(Vec<Option<Count>>, Option<Line>), FormError> {
        let values = (1..=k as u128)
            .map(|j| match self.at(j) {
                Ok(v) => Ok(Some(v)),
                Err(FormError::Unknown) => Ok(None),
                Err(e) => Err(e),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((values, self.line_from(k)?))
    }

    pub fn binary(op: Binary, f: &Form, g: &Form) -> Result<Form, FormError> {
        let k = f.next.len().max(g.next.len()) + 1;
        let ((fv, fl), (gv, gl)) = (f.aligned(k)?, g.aligned(k)?);
        let mut next = Vec::with_capacity(k);
        for (m, n) in fv.into_iter().zip(gv) {
            match (m, n) {
                (Some(m), Some(n)) => next.push(op.value(m, n)?),
                _ => return Ok(Form { now: op.value(f.now, g.now)?, next, tail: None }.normalized()),
            }
        }
        let tail = match (fl, gl) {
            (Some(fl), Some(gl)) => op.line(fl, gl)?,
            _ => None,
        };
        Ok(Form { now: op.value(f.now, g.now)?, next, tail }.normalized())
    }

    pub fn unary(op: Unary, f: &Form) -> Result<Form, FormError> {
        let k = f.next.len() + 1;
        let (values, line) = f.aligned(k)?;
        let mut next = Vec::with_capacity(k);
        for v in values {
            match v {
                Some(v) => next.push(op.value(v)),
                None => return Ok(Form { now: op.value(f.now), next, tail: None }.normalized()),
            }
        }
        // Past the aligned start a line keeps the sign of its first term.
        let tail = line.map(|(a, _)| (op.value(a), 0));
        Ok(Form { now: op.value(f.now), next, tail }.normalized())
    }

    /// The count one instant later: `PREVIOUS`, read at an anchor one instant after this one.
    pub fn delayed(&self, before: Count) -> Form {
        let mut next = Vec::with_capacity(self.next.len() + 1);
        next.push(self.now);
        next.extend_from_slice(&self.next);
        Form { now: before, next, tail: self.tail }.normalized()
    }

    /// Drops the last values of `next` that the line already gives (extended backwards), so a
    /// form stays as short as the transients of its formula.
    pub fn normalized(mut self) -> Form {
        while let (Some(&last), Some((a, b))) = (self.next.last(), self.tail) {
            if a < b || last != a - b {
                break;
            }
            self.next.pop();
            self.tail = Some((a - b, b));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(f: &Form, n: u128) -> Vec<Option<Count>> {
        (0..n).map(|j| f.at(j).ok()).collect()
    }

    fn form(now: Count, next: &[Count], tail: Option<(Count, Count)>) -> Form {
        Form { now, next: next.to_vec(), tail }
    }

    /// Every operation, read at any instant, equals the operation on the operands read there,
    /// wherever the result claims to know its value.
    #[test]
    fn operations_agree_with_pointwise_values() {
        let forms = [
            Form::zero(),
            Form::constant(1),
            Form::event(3),
            form(2, &[5, 0], Some((4, 0))),
            form(0, &[], Some((0, 2))),
            form(1, &[0], Some((3, 1))),
            form(6, &[1, 1], Some((1, 0))),
            form(0, &[7], None),
        ];
        for f in &forms {
            for g in &forms {
                for op in [Binary::Sum, Binary::Product, Binary::Monus] {
                    let r = Form::binary(op, f, g).unwrap();
                    for j in 0..12 {
                        if let Ok(v) = r.at(j) {
                            let expected = op.value(f.at(j).unwrap(), g.at(j).unwrap()).unwrap();
                            assert_eq!(v, expected, "{op:?} of {f:?} and {g:?} at {j}");
                        } else {
                            assert!(f.at(j).is_err() || g.at(j).is_err() || r.tail.is_none());
                        }
                    }
                    // A line is lost only where the true values leave every line.
                    if f.tail.is_some() && g.tail.is_some() && r.tail.is_none() {
                        assert!(op != Binary::Sum, "{op:?} of {f:?} and {g:?}");
                    }
                }
            }
            for op in [Unary::Distinct, Unary::Not] {
                let r = Form::unary(op, f).unwrap();
                for j in 0..12 {
                    if let Ok(v) = f.at(j) {
                        assert_eq!(r.at(j), Ok(op.value(v)), "{op:?} of {f:?} at {j}");
                    }
                }
            }
            let d = f.delayed(9);
            assert_eq!(d.at(0), Ok(9));
            for j in 1..12 {
                assert_eq!(d.at(j).ok(), f.at(j - 1).ok());
            }
        }
    }

    #[test]
    fn normalizing_keeps_values_and_shortens() {
        let f = form(1, &[2, 3, 4], Some((5, 1))).normalized();
        assert_eq!(f, form(1, &[], Some((2, 1))));
        assert_eq!(values(&f, 6), [1, 2, 3, 4, 5, 6].map(Some).to_vec());
        let g = form(4, &[0, 0], Some((0, 0))).normalized();
        assert_eq!(g, Form::event(4));
    }

    #[test]
    fn overflow_is_an_error() {
        let big = Form::constant(Count::MAX / 2 + 1);
        assert_eq!(Form::binary(Binary::Sum, &big, &big), Err(FormError::Overflow));
        let growing = form(0, &[], Some((0, Count::MAX / 4)));
        assert_eq!(growing.at(10), Err(FormError::Overflow));
    }
}
