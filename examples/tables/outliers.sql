-- A long tail, and the outlier index that tames it (Stale View Cleaning, Section 6):
--   tessera run examples/tables/outliers.sql
-- One order in a thousand is a wholesale order worth 500 ordinary ones. A 5% sample misses
-- most of them, and estimates from it swing with the few it holds; an outlier index keeps the
-- view's rows of every order above a threshold whole beside the sample, counted exactly.
CREATE TABLE customers (customer BIGINT PRIMARY KEY, region VARCHAR);
CREATE TABLE orders (order_id BIGINT PRIMARY KEY, customer BIGINT, amount DOUBLE);
INSERT INTO customers SELECT value, CASE value % 3 WHEN 0 THEN 'north' WHEN 1 THEN 'south' ELSE 'west' END
    FROM generate_series(0, 499);
INSERT INTO orders SELECT value, (value * 7919) % 500 AS customer,
    CASE WHEN value % 1000 = 0 THEN 50000 + (value * 7919) % 10000 ELSE 10 + (value * 104729) % 100 END AS amount
    FROM generate_series(1, 100000);

CREATE MATERIALIZED VIEW sales WITH (sample = 0.05) AS
    SELECT order_id, region, amount FROM orders JOIN customers USING (customer);
CREATE MATERIALIZED VIEW sales_indexed WITH (sample = 0.05, outlier_index = 'orders.amount', outlier_threshold = 10000) AS
    SELECT order_id, region, amount FROM orders JOIN customers USING (customer);

-- New orders, three of them wholesale, and some returns.
INSERT INTO orders SELECT value + 1000000, (value * 31) % 500, CASE WHEN value % 4000 = 0 THEN 80000 ELSE 10 + value % 100 END
    FROM generate_series(1, 12000);
DELETE FROM orders WHERE order_id % 97 = 5;

SET freshness = 'svc_corr';
SELECT region, SUM(amount) AS revenue FROM sales GROUP BY region ORDER BY region;           -- sample alone
SELECT region, SUM(amount) AS revenue FROM sales_indexed GROUP BY region ORDER BY region;   -- with the index
EXPLAIN SELECT region, SUM(amount) AS revenue FROM sales_indexed GROUP BY region;
SET freshness = 'exact';
SELECT region, SUM(amount) AS revenue FROM sales GROUP BY region ORDER BY region;           -- refreshed
