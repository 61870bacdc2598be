-- A question across time over the bundled device log (25 devices, about 2.5 hours), written as
-- a temporal formula: the atoms are named in WITH (a SELECT of the events of one kind, binding
-- device_id), the formula is read in FROM TEMPORAL(...). tessera keeps a few counters per
-- device (EXPLAIN shows them), never the events.
CREATE SOURCE events (
    device_id BIGINT,
    kind VARCHAR,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = 'events.csv', format = 'csv', time_unit = 's');

-- Alarms per device since its last service: earlier alarms with no service since, and this
-- instant's. Devices never serviced count every alarm.
WITH alarm   AS (SELECT device_id FROM events WHERE kind = 'alarm'),
     service AS (SELECT device_id FROM events WHERE kind = 'service')
SELECT device_id, COUNT(*) AS alarms_since_service
FROM TEMPORAL(alarm OR SINCE_COUNT(NOT service, alarm))
GROUP BY device_id;
