//! SQL errors: a message, the line and column, a caret under the spot, and for unknown names
//! the closest valid name.

use std::path::Path;

use tessera::engine::Script;

const SOURCE: &str = "CREATE SOURCE readings (device_id BIGINT, temperature DOUBLE, ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'r.csv', time_unit = 's');
";

fn error_of(query: &str) -> String {
    let text = format!("{SOURCE}{query}");
    match Script::compile(&text, Path::new(".")) {
        Ok(_) => panic!("expected an error for {query}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_column_points_at_it_and_suggests() {
    let err = error_of(
        "SELECT device_id, window_start, window_end,\n  MIN(temprature) AS t\nFROM TUMBLE(readings, ts, INTERVAL '1' MINUTE)\nGROUP BY device_id, window_start, window_end;",
    );
    assert!(err.contains("unknown column `temprature`"), "{err}");
    assert!(err.contains("line 4, column 7"), "{err}");
    assert!(err.contains("did you mean `temperature`?"), "{err}");
    assert!(err.contains("4 |   MIN(temprature) AS t\n   |       ^"), "{err}");
}

#[test]
fn unknown_source_suggests_the_declared_one() {
    let err = error_of("SELECT * FROM reading;");
    assert!(err.contains("unknown source `reading`"), "{err}");
    assert!(err.contains("line 3, column 15"), "{err}");
    assert!(err.contains("did you mean `readings`?"), "{err}");
}

#[test]
fn syntax_errors_have_positions() {
    let err = error_of("SELECT device_id FROM readings WHERE;");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains('^'), "{err}");
}

#[test]
fn streaming_restrictions_are_explained() {
    let err = error_of("SELECT device_id, MIN(temperature) FROM readings GROUP BY device_id;");
    assert!(err.contains("need a window"), "{err}");
    let err = error_of(
        "SELECT MIN(temperature) FROM TUMBLE(readings, device_id, INTERVAL '1' MINUTE) GROUP BY window_start;",
    );
    assert!(err.contains("not the event-time column"), "{err}");
    let err = error_of(
        "SELECT device_id, window_start, COUNT(*) FROM HOP(readings, ts, INTERVAL '10' MINUTE, INTERVAL '1' MINUTE) GROUP BY device_id, window_start;",
    );
    assert!(err.contains("slide must not be larger"), "{err}");
    let err = error_of("SELECT device_id, COUNT(*) FROM TUMBLE(readings, ts, INTERVAL '1' MINUTE) GROUP BY device_id;");
    assert!(err.contains("GROUP BY window_start"), "{err}");
    let err = error_of(
        "SELECT window_start, COUNT(*) FROM TUMBLE(readings, ts, INTERVAL '1' MINUTE) GROUP BY window_start ORDER BY 1;",
    );
    assert!(err.contains("ORDER BY is not supported"), "{err}");
    let err = error_of("SET parallelsim = 2;");
    assert!(err.contains("unknown setting `parallelsim`"), "{err}");
    let err = error_of(
        "SELECT window_name, COUNT(*) FROM WINDOWS(readings, ts, a => TUMBLE(INTERVAL '1' MINUTE), a => TUMBLE(INTERVAL '2' MINUTE)) GROUP BY window_name, window_start, window_end;",
    );
    assert!(err.contains("window name `a` is used twice"), "{err}");
    let err = error_of("SELECT COUNT(*) FROM WINDOWS(readings, ts) GROUP BY window_start, window_end;");
    assert!(err.contains("WINDOWS needs a source, its time column and windows"), "{err}");
    let err = error_of(
        "SELECT COUNT(*) FROM WINDOWS(readings, ts, TUMBLE(INTERVAL '1' MINUTE, INTERVAL '2' MINUTE)) GROUP BY window_start, window_end;",
    );
    assert!(err.contains("TUMBLE takes 3 arguments"), "{err}");
    let err = error_of("SET window_strategy = 'fastest';");
    assert!(err.contains("unknown window_strategy 'fastest'"), "{err}");
    assert!(err.contains("'shared_paired', 'shared_sliding', 'baseline', 'unshared_paired'"), "{err}");
    let err = error_of(
        "SELECT window_start, COUNT(*) FROM TUMBLE(readings, ts, INTERVAL '1' MINUTE) GROUP BY window_start EMIT SOMETIMES;",
    );
    assert!(err.contains("expected `EMIT CHANGES` or `EMIT ON WINDOW CLOSE`, found `SOMETIMES`"), "{err}");
    assert!(err.contains("column 105"), "{err}");
    let err = error_of("SELECT ts FROM readings WHERE ts > 0 EMIT CHANGES;");
    assert!(err.contains("EMIT CHANGES applies to window aggregates"), "{err}");
    // Right after the table, where the SQL parser would read `EMIT` as an alias.
    let err = error_of("SELECT ts FROM readings EMIT CHANGES;");
    assert!(err.contains("EMIT CHANGES applies to window aggregates"), "{err}");
    // The default mode, spelled out, is accepted; a quoted "emit" stays an alias.
    for query in ["SELECT ts FROM readings EMIT ON WINDOW CLOSE;", "SELECT emit.ts FROM readings \"emit\";"] {
        let text = format!("{SOURCE}{query}");
        assert!(Script::compile(&text, Path::new(".")).is_ok(), "{query}");
    }
}

const WITH_NAMES: &str = "CREATE SOURCE named (device VARCHAR, temperature DOUBLE, ts BIGINT,
    WATERMARK FOR ts AS ts) WITH (path = 'n.csv');
";

/// The error of a query on `named` (line 3).
fn named_error_of(query: &str) -> String {
    match Script::compile(&format!("{WITH_NAMES}{query}"), Path::new(".")) {
        Ok(_) => panic!("expected an error for {query}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn numeric_aggregates_of_strings_are_refused_at_their_argument() {
    let window = "FROM TUMBLE(named, ts, INTERVAL '1' SECOND) GROUP BY window_start, window_end;";
    for function in ["SUM", "avg", "STDDEV_SAMP", "VAR_SAMP", "MEDIAN", "mean"] {
        let err = named_error_of(&format!("SELECT window_start, {function}(device) AS s {window}"));
        let says = format!(
            "{} needs a numeric argument, `device` is VARCHAR at line 3, column {}",
            function.to_uppercase(),
            23 + function.len()
        );
        assert!(err.contains(&says), "{err}");
        assert!(!err.contains("Internal error") && !err.contains("bug"), "{err}");
    }
    // In HAVING, and inside an expression.
    let err = named_error_of(&format!(
        "SELECT window_start, COUNT(*) AS n {}",
        window.replace(";", " HAVING SUM(device || 'x') > 1;")
    ));
    assert!(err.contains("SUM needs a numeric argument, `device || 'x'` is VARCHAR"), "{err}");
    // Strings are fine where they are ordered or counted.
    let text = format!("{WITH_NAMES}SELECT window_start, MIN(device), MAX(device), COUNT(device), APPROX_COUNT_DISTINCT(device) {window}");
    assert!(Script::compile(&text, Path::new(".")).is_ok());
}

#[test]
fn strings_compared_with_numbers_are_refused_before_reading() {
    let cases = [
        ("SELECT device FROM named WHERE device > 5;", "`device` (VARCHAR) with `5` (BIGINT) at line 3, column 32"),
        ("SELECT device FROM named WHERE 5.5 <= device;", "`device` (VARCHAR) with `5.5` (DOUBLE) at line 3, column 39"),
        ("SELECT device FROM named WHERE device IN ('a', 2);", "`device` (VARCHAR) with `2` (BIGINT) at line 3, column 32"),
        ("SELECT device FROM named WHERE device BETWEEN 1 AND 9;", "`device` (VARCHAR) with `1` (BIGINT)"),
        ("SELECT device = ts AS same FROM named;", "`device` (VARCHAR) with `ts` (BIGINT) at line 3, column 8"),
        ("SELECT ts FROM named WHERE ts > 'soon';", "`'soon'` (VARCHAR) with `ts` (BIGINT) at line 3, column 33"),
        (
            "SELECT window_start, COUNT(*) FROM TUMBLE(named, ts, INTERVAL '1' SECOND) WHERE device <> 0 GROUP BY window_start;",
            "`device` (VARCHAR) with `0` (BIGINT) at line 3, column 81",
        ),
    ];
    for (query, says) in cases {
        let err = named_error_of(query);
        assert!(err.contains(&format!("cannot compare {says}")), "{query}: {err}");
        assert!(err.contains("help: compare with a string, or CAST("), "{err}");
    }
    // Strings with strings, numbers with numbers written in quotes, and explicit casts.
    for query in [
        "SELECT device FROM named WHERE device > '5' AND device IN ('a', 'b');",
        "SELECT ts FROM named WHERE ts > '5' AND temperature BETWEEN '1' AND 30;",
        "SELECT device FROM named WHERE CAST(device AS BIGINT) > 5;",
    ] {
        assert!(Script::compile(&format!("{WITH_NAMES}{query}"), Path::new(".")).is_ok(), "{query}");
    }
}

#[test]
fn two_sources_reading_stdin_are_refused() {
    let sources =
        "CREATE SOURCE a (k BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (connector = 'stdin', format = 'csv');
CREATE SOURCE b (k BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = '-', format = 'csv');
";
    let text = format!("{sources}SELECT k FROM a;\nSELECT k FROM a WHERE k > 1;\nSELECT k FROM b;");
    let err = Script::compile(&text, Path::new(".")).unwrap_err().to_string();
    assert!(
        err.contains("sources `a` and `b` both read stdin, which can be read only once at line 5, column 1"),
        "{err}"
    );
    // Declaring a second one is harmless while only one is read.
    let text = format!("{sources}SELECT k FROM a;\nSELECT k FROM a WHERE k > 1;");
    assert!(Script::compile(&text, Path::new(".")).is_ok());
}
