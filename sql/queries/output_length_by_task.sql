-- Output length by a metadata field (here "task"; change the JSON path for your own field).
SELECT q.run_id, json_extract_string(q.metadata_json, '$.task') AS task,
       count(*) AS requests, avg(o.num_output_tokens) AS mean_output_tokens,
       quantile_cont(o.num_output_tokens, 0.9) AS p90_output_tokens
FROM requests q JOIN outputs o USING (run_id, request_id)
GROUP BY ALL ORDER BY q.run_id, task;
