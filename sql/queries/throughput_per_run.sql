-- Throughput per run: tokens in and out, wall time, tokens per second, prefix-cache hits.
SELECT r.run_id, r.engine, r.policy, r.status,
       count(o.request_id)                                   AS outputs,
       sum(o.num_prompt_tokens)                              AS input_tokens,
       sum(o.num_output_tokens)                              AS output_tokens,
       max(m.value) FILTER (m.name = 'wall_seconds')         AS wall_seconds,
       max(m.value) FILTER (m.name = 'tokens_per_second')    AS tokens_per_second,
       max(m.value) FILTER (m.name = 'prefix_hit_rate')      AS prefix_hit_rate
FROM runs r
LEFT JOIN outputs o USING (run_id)
LEFT JOIN metrics m USING (run_id)
GROUP BY ALL
ORDER BY r.started_at DESC;
