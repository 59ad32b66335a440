-- Throughput per run: tokens in and out, wall time, tokens per second, prefix-cache hits.
-- Outputs and metrics are aggregated apart and then joined one row per run: joining the tables
-- row by row first would count every output once per metric.
WITH totals AS (
    SELECT run_id, count(*) AS outputs, sum(num_prompt_tokens) AS input_tokens, sum(num_output_tokens) AS output_tokens
    FROM outputs GROUP BY run_id
), run_metrics AS (
    SELECT run_id,
           max(value) FILTER (name = 'wall_seconds')      AS wall_seconds,
           max(value) FILTER (name = 'tokens_per_second') AS tokens_per_second,
           max(value) FILTER (name = 'prefix_hit_rate')   AS prefix_hit_rate
    FROM metrics GROUP BY run_id
)
SELECT r.run_id, r.airflow_run_id, r.engine, r.policy, r.status,
       coalesce(t.outputs, 0) AS outputs, coalesce(t.input_tokens, 0) AS input_tokens,
       coalesce(t.output_tokens, 0) AS output_tokens, m.wall_seconds, m.tokens_per_second, m.prefix_hit_rate
FROM runs r
LEFT JOIN totals t USING (run_id)
LEFT JOIN run_metrics m USING (run_id)
ORDER BY r.started_at DESC;
