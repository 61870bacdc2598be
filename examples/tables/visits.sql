-- Tables, a materialized view over their join, changes, and an incremental refresh:
--   tessera run examples/tables/visits.sql               (the database in memory)
--   tessera run --db shop examples/tables/visits.sql     (kept in the folder shop/)
CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE)
    WITH (path = 'video.csv', format = 'csv');
CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT) WITH (path = 'log.csv');

CREATE MATERIALIZED VIEW visit_view AS
    SELECT video_id, owner_id, COUNT(*) AS visit_count, AVG(duration) AS mean_duration
    FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id;

-- New sessions, one deleted, one moved to another video.
COPY log FROM 'log_new.csv' WITH (format = 'csv', op_column = 'op');

SELECT video_id, visit_count FROM visit_view ORDER BY video_id;   -- stale
EXPLAIN REFRESH MATERIALIZED VIEW visit_view;
REFRESH MATERIALIZED VIEW visit_view;
SELECT video_id, visit_count FROM visit_view ORDER BY video_id;   -- fresh
