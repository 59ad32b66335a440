"""Arrow schemas shared by every stage: normalized requests and results.

A request file after ingestion (and a workload file written by
``blendserve workload``) is Parquet with ``REQUEST_SCHEMA``. Shards write
``RESULT_SCHEMA`` part files that the single DuckDB writer loads.
"""

from __future__ import annotations

import pyarrow as pa

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),  # the user's custom_id
        pa.field("endpoint", pa.string(), nullable=False),  # "chat" | "completion" | "tokens"
        pa.field("prompt", pa.string()),  # completion prompt text, if any
        pa.field("messages_json", pa.string()),  # chat messages as JSON, if any
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),  # after the chat template
        pa.field("num_prompt_tokens", pa.int32(), nullable=False),
        pa.field("max_tokens", pa.int32(), nullable=False),
        pa.field("temperature", pa.float32(), nullable=False),
        pa.field("top_p", pa.float32(), nullable=False),
        pa.field("seed", pa.int64()),
        pa.field("stop_json", pa.string()),  # JSON list of stop strings
        pa.field("expected_output_tokens", pa.int32()),  # known in advance: the planner may use it
        pa.field("sim_output_tokens", pa.int32()),  # true length, read only by the simulator
        pa.field("metadata_json", pa.string()),  # user's metadata, passed through
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_row", pa.int64(), nullable=False),  # 1-based line or row number
    ]
)

RESULT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # "ok" | "error"
        pa.field("text", pa.string()),
        pa.field("output_token_ids", pa.list_(pa.int32())),
        pa.field("finish_reason", pa.string()),  # "stop" | "length" | "error"
        pa.field("num_prompt_tokens", pa.int32(), nullable=False),
        pa.field("num_output_tokens", pa.int32(), nullable=False),
        pa.field("num_cached_tokens", pa.int32()),  # prompt tokens served from the prefix cache
        pa.field("error", pa.string()),  # reason, when status = "error"
        pa.field("engine", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("finished_at", pa.timestamp("us", tz="UTC")),
    ]
)

REJECT_SCHEMA = pa.schema(
    [
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_row", pa.int64(), nullable=False),  # 1-based line or row; 0 = the whole file
        pa.field("raw", pa.string(), nullable=False),  # the record as read, truncated
        pa.field("reason", pa.string(), nullable=False),  # what is wrong and what to do
    ]
)
