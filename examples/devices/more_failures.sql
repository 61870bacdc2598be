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

-- Devices with more failures than successes so far, and by how many (AND NOT subtracts).
WITH failure AS (SELECT device_id FROM events WHERE kind = 'failure'),
     success AS (SELECT device_id FROM events WHERE kind = 'success')
SELECT device_id, COUNT(*) AS failures_beyond_successes
FROM TEMPORAL(SO_FAR(failure) AND NOT SO_FAR(success))
GROUP BY device_id;
