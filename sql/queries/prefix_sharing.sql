-- Prefix-cache hits: share of prompt tokens the engine did not recompute, per run and shard.
SELECT run_id, shard, sum(num_cached_tokens) AS cached_tokens, sum(num_prompt_tokens) AS prompt_tokens,
       sum(num_cached_tokens) / nullif(sum(num_prompt_tokens), 0) AS hit_rate
FROM outputs WHERE status = 'ok'
GROUP BY ALL ORDER BY run_id, shard;
