-- MIN(temperature) per device over 10, 20, 30 and 40 minute tumbling windows and a 30-minute
-- window sliding every minute, over the bundled sensor readings (20 devices, about 17 minutes,
-- up to 3 seconds out of order).
CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = 'readings.csv', format = 'csv', time_unit = 's');

SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '10' MINUTE)
GROUP BY device_id, window_start, window_end
UNION ALL
SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '20' MINUTE)
GROUP BY device_id, window_start, window_end
UNION ALL
SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '30' MINUTE)
GROUP BY device_id, window_start, window_end
UNION ALL
SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM TUMBLE(readings, ts, INTERVAL '40' MINUTE)
GROUP BY device_id, window_start, window_end
UNION ALL
SELECT device_id, window_start, window_end, MIN(temperature) AS min_temp
FROM HOP(readings, ts, INTERVAL '1' MINUTE, INTERVAL '30' MINUTE)
GROUP BY device_id, window_start, window_end;
