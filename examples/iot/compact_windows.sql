-- The multi-window example in the compact form: one SELECT over several windows of one source,
-- `window_name` saying which window a row belongs to. It runs exactly like the UNION ALL of
-- multi_window.sql (see `tessera explain examples/iot/compact_windows.sql`).
CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = 'readings.csv', format = 'csv', time_unit = 's');

SELECT device_id, window_name, window_start, window_end, MIN(temperature) AS min_temp
FROM WINDOWS(readings, ts,
             m10 => TUMBLE(INTERVAL '10' MINUTE),
             m20 => TUMBLE(INTERVAL '20' MINUTE),
             m30 => TUMBLE(INTERVAL '30' MINUTE),
             m40 => TUMBLE(INTERVAL '40' MINUTE),
             sliding_m30 => HOP(INTERVAL '1' MINUTE, INTERVAL '30' MINUTE))
GROUP BY device_id, window_name, window_start, window_end;
