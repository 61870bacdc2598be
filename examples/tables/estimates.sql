-- Fresh answers with confidence intervals from a stale view (Stale View Cleaning):
--   tessera run examples/tables/estimates.sql
-- A view keeps a 10% hash sample of its rows; between refreshes, queries over it are answered
-- from the sample cleaned of the changes, with intervals, instead of with stale numbers.
CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE);
CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT);
INSERT INTO video SELECT value, value % 20 AS owner_id, CAST(30 + (value * 7919) % 600 AS DOUBLE) AS duration
    FROM generate_series(1, 5000);
INSERT INTO log SELECT value, (value * 104729) % 5000 + 1 AS video_id FROM generate_series(1, 200000);

CREATE MATERIALIZED VIEW visit_view WITH (sample = 0.1) AS
    SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
    FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;

-- New sessions arrive, mostly on the first 1,000 videos, and some old ones are deleted.
INSERT INTO log SELECT value + 1000000, (value * 7907) % 1000 + 1 AS video_id FROM generate_series(1, 30000);
DELETE FROM log WHERE session_id % 50 = 7;

SELECT COUNT(*) AS n, AVG(duration) AS d FROM visit_view WHERE visit_count > 45;   -- stale
SET freshness = 'svc_corr';
SELECT COUNT(*) AS n, AVG(duration) AS d FROM visit_view WHERE visit_count > 45;   -- estimated
SELECT owner_id, SUM(visit_count) AS v FROM visit_view GROUP BY owner_id ORDER BY owner_id LIMIT 5;
EXPLAIN SELECT COUNT(*) AS n, AVG(duration) AS d FROM visit_view WHERE visit_count > 45;
SET freshness = 'exact';
SELECT COUNT(*) AS n, AVG(duration) AS d FROM visit_view WHERE visit_count > 45;   -- refreshed
