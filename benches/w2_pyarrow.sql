-- W2 over the file pyarrow writes (`scripts/bench.py --formats pyarrow`): SUM and COUNT per
-- device over a 30-minute window sliding every minute.
CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = '../bench-data/iot-pyarrow.parquet', time_unit = 's');

SELECT device_id, window_start, window_end, SUM(temperature) AS total, COUNT(*) AS n
FROM HOP(readings, ts, INTERVAL '1' MINUTE, INTERVAL '30' MINUTE) GROUP BY device_id, window_start, window_end;
