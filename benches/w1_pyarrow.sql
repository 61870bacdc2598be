-- W1 over the file pyarrow writes (`scripts/bench.py --formats pyarrow`): MIN(temperature)
-- per device over tumbling 10, 20, 30 and 40 minutes, as four window queries in one script.
CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = '../bench-data/iot-pyarrow.parquet', time_unit = 's');

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '10' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '20' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '30' MINUTE) GROUP BY device_id, window_start, window_end;

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '40' MINUTE) GROUP BY device_id, window_start, window_end;
