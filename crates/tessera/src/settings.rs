//! The one registry of a session's settings: every name `SET`, `SHOW`, `--set` and the docs
//! know, with its values, default, what it applies to and what it does. A script of streams, a
//! database script and the shell read the same [`Settings`]; a setting is valid in every one of
//! them and takes effect wherever what it applies to runs (window settings on the windows a
//! database script runs too).

use crate::optimizer::window_strategy::Strategy;
use crate::plan::TemporalStrategy;

/// The most worker threads a run takes (`SET parallelism`, `--parallelism`).
pub const MAX_PARALLELISM: usize = 256;
/// The most rows per input batch (`SET batch_size`): a batch is decoded in one piece.
pub const MAX_BATCH_SIZE: usize = 1 << 20;
/// The range of `SET eta` (events per time unit and key assumed by the cost model).
pub const ETA_RANGE: (f64, f64) = (1e-6, 1e9);
/// The most distinct keys `SET keys` may tell the cost model.
pub const MAX_KEYS: u64 = 1_000_000_000_000;
/// The longest `SET input_flush_ms`: a minute.
pub const MAX_INPUT_FLUSH_MS: u64 = 60_000;
/// The longest `SET lock_wait_ms`: an hour.
pub const MAX_LOCK_WAIT_MS: u64 = 3_600_000;

/// The smallest `SET memory_limit`: a megabyte.
pub const MIN_MEMORY_LIMIT: u64 = 1 << 20;
/// The largest size a setting or option takes: 2^50 bytes (1048576GB), far beyond any
/// machine's memory and far from overflowing the arithmetic of budgets.
pub const MAX_SIZE: u64 = 1 << 50;

/// A size in bytes: a number with an optional KB, MB or GB (powers of 1024), at most
/// [`MAX_SIZE`].
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let upper = text.trim().to_ascii_uppercase();
    // The unit is the letters at the end (`1e3MB` is a thousand megabytes).
    let (number, unit) = upper.split_at(upper.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len());
    let scale: Option<u64> = match unit {
        "" | "B" => Some(1),
        "KB" | "KIB" => Some(1 << 10),
        "MB" | "MIB" => Some(1 << 20),
        "GB" | "GIB" => Some(1 << 30),
        _ => None,
    };
    let bytes = scale.and_then(|scale| Some(number.trim().parse::<f64>().ok()? * scale as f64));
    match bytes {
        Some(bytes) if (0.0..=MAX_SIZE as f64).contains(&bytes) => Ok(bytes as u64),
        _ => Err(format!(
            "expected a size between 0 and {}GB, a number and KB, MB or GB such as 256MB, got `{text}`",
            MAX_SIZE >> 30
        )),
    }
}

/// `bytes` as [`parse_size`] reads it: in the largest unit that divides it.
pub fn show_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KB", b >> 10),
        b => b.to_string(),
    }
}

/// A setting as users see it.
#[derive(Debug, Clone, Copy)]
pub struct SettingDoc {
    pub name: &'static str,
    /// The values it takes.
    pub values: &'static str,
    /// What runs differently with it.
    pub applies_to: &'static str,
    pub doc: &'static str,
}

/// Every setting, in the order `SHOW ALL` lists them.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        name: "parallelism",
        values: "1 to 256, or `auto`",
        applies_to: "queries over streams",
        doc: "worker threads (the command line's --parallelism wins); auto: chosen per script, up to the cores",
    },
    SettingDoc {
        name: "batch_size",
        values: "1 to 1048576",
        applies_to: "sources",
        doc: "rows per batch read from a source",
    },
    SettingDoc {
        name: "eta",
        values: "0.000001 to 1000000000",
        applies_to: "windows",
        doc: "events per time unit and group key that the window cost model assumes",
    },
    SettingDoc {
        name: "keys",
        values: "1 to 1000000000000, or `many`",
        applies_to: "windows",
        doc: "distinct group keys that the window cost model assumes",
    },
    SettingDoc {
        name: "window_strategy",
        values: "auto, baseline, unshared_paired, shared_paired, wcg, wcg_factor",
        applies_to: "windows",
        doc: "how windows over one stream are evaluated; auto: the cheapest by the cost model",
    },
    SettingDoc {
        name: "input_flush_ms",
        values: "0 to 60000",
        applies_to: "sources",
        doc: "how long a reader of a pipe keeps rows before handing over a batch that is not full",
    },
    SettingDoc {
        name: "allow_unbounded_state",
        values: "true, false",
        applies_to: "continuous temporal queries",
        doc: "run a query no bounded synopsis answers by keeping every event of its source",
    },
    SettingDoc {
        name: "temporal_strategy",
        values: "synopsis, kept_whole",
        applies_to: "continuous temporal queries",
        doc: "answer from bounded synopses, or from every event kept (a batch query)",
    },
    SettingDoc {
        name: "freshness",
        values: "stale, svc_aqp, svc_corr, auto, exact",
        applies_to: "queries over materialized views",
        doc: "stale contents, estimates from the cleaned sample with intervals, or views refreshed first",
    },
    SettingDoc {
        name: "confidence",
        values: "a probability strictly between 0 and 1",
        applies_to: "estimates over materialized views",
        doc: "the probability an estimate's interval covers the fresh answer",
    },
    SettingDoc {
        name: "lock_wait_ms",
        values: "0 to 3600000",
        applies_to: "statements that write a database folder",
        doc: "how long a statement waits while another process writes the database before it is refused; 0: refused at once",
    },
    SettingDoc {
        name: "memory_limit",
        values: "a size such as 512MB or 1GB (at least 1MB), or `none`",
        applies_to: "statements over tables and views",
        doc: "the memory a statement's sorts, aggregates and joins hold at most: beyond it they spill to the database folder's tmp/, and what cannot spill stops the statement with the limit named",
    },
];

/// How a query over materialized views is answered (`SET freshness`).
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

/// A session's settings (`SET name = value`, `--set name=value`).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Worker threads (`SET parallelism`); the command line overrides it.
    pub parallelism: Option<usize>,
    /// Rows per batch read from a source.
    pub batch_size: usize,
    /// Events per event-time unit and group key assumed by the cost model.
    pub eta: f64,
    /// Distinct group keys assumed by the cost model (`SET keys`; `None`: many).
    pub keys: Option<f64>,
    /// How windows are evaluated (`SET window_strategy`): `None` lets the optimizer choose.
    pub window_strategy: Option<Strategy>,
    /// How long a reader of a pipe (stdin) keeps rows it has before handing them over in a
    /// batch that is not full (`SET input_flush_ms`).
    pub input_flush_ms: u64,
    /// Run continuous queries that no bounded synopsis answers by keeping every event of their
    /// source and answering with a batch query over them (`SET allow_unbounded_state`).
    pub allow_unbounded_state: bool,
    /// How continuous temporal queries run (`SET temporal_strategy`).
    pub temporal_strategy: TemporalStrategy,
    /// How queries over materialized views are answered.
    pub freshness: Freshness,
    /// The probability the intervals of estimates cover the fresh answer.
    pub confidence: f64,
    /// How long a statement that writes a database folder waits for another process's write
    /// lock before it is refused (`SET lock_wait_ms`).
    pub lock_wait_ms: u64,
    /// The bytes a statement over tables holds at most in its operators (`SET memory_limit`).
    pub memory_limit: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            parallelism: None,
            batch_size: crate::connectors::DEFAULT_BATCH_SIZE,
            eta: 1.0,
            keys: None,
            window_strategy: None,
            input_flush_ms: 200,
            allow_unbounded_state: false,
            temporal_strategy: TemporalStrategy::Synopsis,
            freshness: Freshness::Stale,
            confidence: 0.95,
            lock_wait_ms: 0,
            memory_limit: None,
        }
    }
}

/// `text` as a number from `min` to `max` (inclusive); the error states the range.
pub fn parse_between<T>(text: &str, min: T, max: T) -> std::result::Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    text.trim()
        .parse::<T>()
        .ok()
        .filter(|value| *value >= min && *value <= max)
        .ok_or_else(|| format!("must be between {min} and {max}, got '{text}'"))
}

impl Settings {
    /// Applies `SET name = value` (`name` in lower case); an unknown name or a value out of its
    /// range is an error that says what is accepted.
    pub fn set(&mut self, name: &str, value: &str) -> std::result::Result<(), String> {
        let named = |message: String| format!("{name} {message}");
        let lower = value.trim().to_ascii_lowercase();
        match name {
            "parallelism" if lower == "auto" => self.parallelism = None,
            "parallelism" => self.parallelism = Some(parse_between(value, 1, MAX_PARALLELISM).map_err(named)?),
            "batch_size" => self.batch_size = parse_between(value, 1, MAX_BATCH_SIZE).map_err(named)?,
            "eta" => self.eta = parse_between(value, ETA_RANGE.0, ETA_RANGE.1).map_err(named)?,
            "keys" if lower == "many" => self.keys = None,
            "keys" => self.keys = Some(parse_between(value, 1, MAX_KEYS).map_err(named)? as f64),
            "window_strategy" if lower == "auto" => self.window_strategy = None,
            "window_strategy" => {
                self.window_strategy = Some(Strategy::parse(&lower).ok_or_else(|| {
                    let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
                    format!("unknown window_strategy '{lower}' (known: 'auto', '{}')", names.join("', '"))
                })?)
            }
            "input_flush_ms" => self.input_flush_ms = parse_between(value, 0, MAX_INPUT_FLUSH_MS).map_err(named)?,
            "allow_unbounded_state" => {
                self.allow_unbounded_state = match lower.as_str() {
                    "true" | "on" => true,
                    "false" | "off" => false,
                    _ => return Err(format!("allow_unbounded_state is true or false, got '{value}'")),
                }
            }
            "temporal_strategy" => {
                self.temporal_strategy = TemporalStrategy::parse(value)
                    .ok_or_else(|| format!("unknown temporal_strategy '{value}' (known: 'synopsis', 'kept_whole')"))?
            }
            "freshness" => {
                self.freshness =
                    Freshness::NAMES.iter().find(|(n, _)| *n == lower).map(|(_, f)| *f).ok_or_else(|| {
                        let names: Vec<&str> = Freshness::NAMES.iter().map(|(n, _)| *n).collect();
                        format!("freshness `{value}` is not one of {}", names.join(", "))
                    })?;
            }
            "confidence" => match value.trim().parse::<f64>() {
                Ok(c) if c > 0.0 && c < 1.0 => self.confidence = c,
                _ => return Err(format!("confidence `{value}` is not a probability strictly between 0 and 1")),
            },
            "lock_wait_ms" => self.lock_wait_ms = parse_between(value, 0, MAX_LOCK_WAIT_MS).map_err(named)?,
            "memory_limit" if lower == "none" => self.memory_limit = None,
            "memory_limit" => match parse_size(value).map_err(named)? {
                bytes if bytes >= MIN_MEMORY_LIMIT => self.memory_limit = Some(bytes),
                _ => return Err(format!("memory_limit must be at least 1MB, got '{value}'")),
            },
            _ => {
                let names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
                let hint = crate::sql::diagnostic::closest_name(name, names.iter().copied())
                    .map_or(String::new(), |c| format!("did you mean `{c}`? "));
                return Err(format!("unknown setting `{name}`: {hint}the settings are {}", names.join(", ")));
            }
        }
        Ok(())
    }

    /// The value of setting `name` as `SET` takes it, or `None` for an unknown name.
    pub fn get(&self, name: &str) -> Option<String> {
        Some(match name {
            "parallelism" => self.parallelism.map_or("auto".into(), |n| n.to_string()),
            "batch_size" => self.batch_size.to_string(),
            "eta" => self.eta.to_string(),
            "keys" => self.keys.map_or("many".into(), |k| k.to_string()),
            "window_strategy" => self.window_strategy.map_or("auto", |s| s.name()).to_string(),
            "input_flush_ms" => self.input_flush_ms.to_string(),
            "allow_unbounded_state" => self.allow_unbounded_state.to_string(),
            "temporal_strategy" => match self.temporal_strategy {
                TemporalStrategy::Synopsis => "synopsis",
                TemporalStrategy::KeptWhole => "kept_whole",
            }
            .to_string(),
            "freshness" => self.freshness.name().to_string(),
            "confidence" => self.confidence.to_string(),
            "lock_wait_ms" => self.lock_wait_ms.to_string(),
            "memory_limit" => self.memory_limit.map_or("none".into(), show_size),
            _ => return None,
        })
    }

    /// What runs on the streaming engine depends on: the settings of streams and windows, not
    /// those of views (a checkpoint's fingerprint).
    pub fn of_streams(&self) -> String {
        let streams =
            SETTINGS.iter().filter(|s| !["freshness", "confidence", "lock_wait_ms", "memory_limit"].contains(&s.name));
        streams.map(|s| format!("{}={}", s.name, self.get(s.name).unwrap_or_default())).collect::<Vec<_>>().join(" ")
    }
}

/// A `--set NAME=VALUE` option as (lower-case name, value).
pub fn parse_assignment(text: &str) -> std::result::Result<(String, String), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got '{text}'"))?;
    Ok((name.trim().to_ascii_lowercase(), value.trim().trim_matches('\'').to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_setting_is_read_and_shown() {
        let mut settings = Settings::default();
        for setting in SETTINGS {
            let shown = settings.get(setting.name).unwrap_or_else(|| panic!("{} is not shown", setting.name));
            // Its own shown value is one it takes.
            settings.set(setting.name, &shown).unwrap_or_else(|e| panic!("{}: {e}", setting.name));
            assert_eq!(settings, Settings::default(), "{}", setting.name);
        }
        let err = settings.set("window_strategi", "wcg").unwrap_err();
        assert!(err.contains("did you mean `window_strategy`?"), "{err}");
        assert!(settings.set("batch_size", "0").unwrap_err().contains("between 1 and 1048576"));
        assert!(settings.set("confidence", "1").is_err());
    }
}
