//! How fresh the answers of queries over materialized views are (`SET freshness`): the stale
//! contents (`stale`, the default), the views refreshed first (`exact`), or estimates of the
//! fresh answer with confidence intervals at `SET confidence` from the view's cleaned sample
//! (`svc_aqp`, `svc_corr`, `auto`; Stale View Cleaning, Section 5).

/// How a query over materialized views is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Freshness {
    /// From the views' contents as of their last refresh.
    #[default]
    Stale,
    /// From the clean sample alone, scaled (SVC+AQP).
    SvcAqp,
    /// The stale answer plus the change estimated from the clean and stale samples (SVC+CORR).
    SvcCorr,
    /// SVC+CORR or SVC+AQP, whichever has the smaller estimated variance for the query.
    Auto,
    /// The views refreshed, then the query answered.
    Exact,
}

impl Freshness {
    const NAMES: [(&'static str, Freshness); 5] = [
        ("stale", Freshness::Stale),
        ("svc_aqp", Freshness::SvcAqp),
        ("svc_corr", Freshness::SvcCorr),
        ("auto", Freshness::Auto),
        ("exact", Freshness::Exact),
    ];

    pub fn name(self) -> &'static str {
        Freshness::NAMES.iter().find(|(_, f)| *f == self).map_or("stale", |(n, _)| n)
    }

    /// Whether the answer is estimated from samples.
    pub fn estimates(self) -> bool {
        matches!(self, Freshness::SvcAqp | Freshness::SvcCorr | Freshness::Auto)
    }
}

/// The settings of a session over a database.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub freshness: Freshness,
    /// The probability the intervals of estimates cover the fresh answer.
    pub confidence: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { freshness: Freshness::Stale, confidence: 0.95 }
    }
}

impl Settings {
    /// Applies `SET name = value`; an unknown name or a bad value is an error that says what
    /// is accepted.
    pub fn set(&mut self, name: &str, value: &str) -> std::result::Result<(), String> {
        match name {
            "freshness" => {
                let lower = value.to_ascii_lowercase();
                self.freshness =
                    Freshness::NAMES.iter().find(|(n, _)| *n == lower).map(|(_, f)| *f).ok_or_else(|| {
                        let names: Vec<&str> = Freshness::NAMES.iter().map(|(n, _)| *n).collect();
                        format!("freshness `{value}` is not one of {}", names.join(", "))
                    })?;
            }
            "confidence" => match value.parse::<f64>() {
                Ok(c) if c > 0.0 && c < 1.0 => self.confidence = c,
                _ => return Err(format!("confidence `{value}` is not a probability strictly between 0 and 1")),
            },
            other => return Err(format!("unknown setting `{other}`: the database has freshness and confidence")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_bad_values_and_say_what_is_accepted() {
        let mut settings = Settings::default();
        settings.set("freshness", "SVC_CORR").unwrap();
        assert_eq!(settings.freshness, Freshness::SvcCorr);
        let e = settings.set("freshness", "fresh").unwrap_err();
        assert!(e.contains("stale, svc_aqp, svc_corr, auto, exact"), "{e}");
        for bad in ["0", "1", "1.5", "-0.1", "x"] {
            assert!(settings.set("confidence", bad).is_err(), "{bad}");
        }
        settings.set("confidence", "0.9").unwrap();
        assert_eq!(settings.confidence, 0.9);
        assert!(settings.set("fresh", "x").unwrap_err().contains("unknown setting"));
    }
}
