-- Why requests failed: rejects at ingest and engine errors, by reason.
SELECT run_id, 'rejected at ingest' AS stage, reason, count(*) AS requests FROM rejects GROUP BY ALL
UNION ALL
SELECT run_id, 'failed in the engine', error, count(*) FROM outputs WHERE status = 'error' GROUP BY ALL
ORDER BY requests DESC;
