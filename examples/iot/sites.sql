-- A window query fills a table, and a materialized view joins it with a table of sites:
--   tessera run examples/iot/sites.sql
-- Streams and tables meet in one script: a query that reads a source runs on the streaming
-- engine to the end of its input, and INSERT INTO ... SELECT stores its rows.
CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = 'readings.csv', format = 'csv', time_unit = 's');

-- The window's start is counted in seconds, as the source's time: the table's time_unit says so.
CREATE TABLE per_10min (
    device_id BIGINT, window_start TIMESTAMP, low DOUBLE, high DOUBLE, readings BIGINT,
    PRIMARY KEY (device_id, window_start)
) WITH (time_unit = 's');
INSERT INTO per_10min
    SELECT device_id, window_start, MIN(temperature), MAX(temperature), COUNT(*)
    FROM TUMBLE(readings, ts, INTERVAL '10' MINUTE)
    GROUP BY device_id, window_start, window_end;

-- Devices 0-9 are in the north hall, 10-19 in the south hall.
CREATE TABLE device (device_id BIGINT PRIMARY KEY, site VARCHAR);
INSERT INTO device SELECT value, CASE WHEN value < 10 THEN 'north' ELSE 'south' END
    FROM generate_series(0, 19);

CREATE MATERIALIZED VIEW per_site AS
    SELECT site, MIN(low) AS low, MAX(high) AS high, SUM(readings) AS readings
    FROM per_10min JOIN device USING (device_id) GROUP BY site;
SELECT * FROM per_site ORDER BY site;

-- Two devices move to the south hall: the refresh maintains the view from that change.
UPDATE device SET site = 'south' WHERE device_id IN (8, 9);
EXPLAIN REFRESH MATERIALIZED VIEW per_site;
REFRESH MATERIALIZED VIEW per_site;
SELECT * FROM per_site ORDER BY site;
