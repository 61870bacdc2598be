-- W1 (see w1_parquet.sql) with every window on its own slices, computed from the raw stream:
-- the baseline that slice sharing is measured against.
SET window_strategy = 'baseline';

CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = '../bench-data/iot.parquet', time_unit = 's');

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '10' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '20' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '30' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '40' MINUTE) GROUP BY device_id, window_start, window_end;
