-- A funnel over the bundled clickstream (40 users, about 2 hours): per user, how many
-- (login, view, purchase) triples happened in that order. tessera keeps one counter per user
-- and step (EXPLAIN shows them), never the events: its state does not grow with the stream.
CREATE SOURCE events (
    user_id BIGINT,
    kind VARCHAR,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = 'events.csv', format = 'csv', time_unit = 's');

SELECT a.user_id, COUNT(*) AS journeys
FROM events a, events b, events c
WHERE a.user_id = b.user_id AND b.user_id = c.user_id
  AND a.kind = 'login' AND b.kind = 'view' AND c.kind = 'purchase'
  AND a.ts < b.ts AND b.ts < c.ts
GROUP BY a.user_id;
