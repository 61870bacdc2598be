-- Ten tumbling windows of 1 to 10 seconds, SUM per device, over a stream of 10 devices: few
-- keys per window instance, where what every instance costs decides between plans. Data:
-- tessera generate -o bench-data/few-keys.parquet --events 300000 --devices 10
CREATE SOURCE s (device_id BIGINT, temperature DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = '../bench-data/few-keys.parquet', time_unit = 's');
SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '6' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '10' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '8' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '1' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '9' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '2' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '5' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '4' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '7' SECOND) GROUP BY device_id, window_start, window_end
UNION ALL SELECT device_id, window_start, window_end, SUM(temperature) AS a FROM TUMBLE(s, ts, INTERVAL '3' SECOND) GROUP BY device_id, window_start, window_end;
