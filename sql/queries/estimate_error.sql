-- Output-length estimates against what the model produced: overall and per estimate source.
-- MAPE = mean absolute percentage error; bias > 0 means the plan expected longer answers.
WITH pairs AS (
    SELECT p.run_id, coalesce(s.kind, 'default') AS kind, p.est_output_tokens AS est, o.num_output_tokens AS actual
    FROM plan p
    JOIN outputs o USING (run_id, request_id)
    LEFT JOIN samples s USING (run_id, request_id)
    WHERE o.status = 'ok' AND p.shard >= 0
)
SELECT run_id, kind, count(*) AS requests,
       avg(abs(est - actual) / greatest(actual, 1)) AS mape,
       avg((est - actual) / greatest(actual, 1))    AS bias
FROM pairs
GROUP BY GROUPING SETS ((run_id, kind), (run_id))
ORDER BY run_id, kind NULLS FIRST;
