-- blendserve DuckDB schema. Created by the pipeline (blendserve.store.connect);
-- every statement is idempotent, so it runs at the start of every step.
-- Keys: (run_id, request_id) everywhere a row belongs to one request of one run.

CREATE TABLE IF NOT EXISTS runs (
    run_id        VARCHAR PRIMARY KEY,
    config_json   VARCHAR NOT NULL,          -- the RunConfig the run was started with
    input         VARCHAR NOT NULL,          -- input file or glob
    engine        VARCHAR NOT NULL,
    policy        VARCHAR NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    finished_at   TIMESTAMPTZ,
    status        VARCHAR NOT NULL           -- running | finished | failed
);
-- The id an Airflow run was started under (e.g. manual__2026-11-30T15:00:00+00:00); run_id is its
-- safe form (config.safe_run_id), which names folders and export files. NULL for CLI runs.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS airflow_run_id VARCHAR;

CREATE TABLE IF NOT EXISTS requests (
    run_id                  VARCHAR NOT NULL,
    request_id              VARCHAR NOT NULL,  -- the user's custom_id
    endpoint                VARCHAR NOT NULL,  -- chat | completion | tokens
    num_prompt_tokens       INTEGER NOT NULL,
    max_tokens              INTEGER NOT NULL,
    temperature             REAL NOT NULL,
    top_p                   REAL NOT NULL,
    seed                    BIGINT,
    expected_output_tokens  INTEGER,
    metadata_json           VARCHAR,
    source_file             VARCHAR NOT NULL,
    source_row              BIGINT NOT NULL,
    PRIMARY KEY (run_id, request_id)
);

CREATE TABLE IF NOT EXISTS rejects (
    run_id       VARCHAR NOT NULL,
    source_file  VARCHAR NOT NULL,
    source_row   BIGINT NOT NULL,          -- 1-based line or row; 0 = the whole file
    raw          VARCHAR NOT NULL,         -- the record as read, truncated
    reason       VARCHAR NOT NULL,
    PRIMARY KEY (run_id, source_file, source_row)
);

CREATE TABLE IF NOT EXISTS outputs (
    run_id             VARCHAR NOT NULL,
    request_id         VARCHAR NOT NULL,
    shard              INTEGER NOT NULL,
    status             VARCHAR NOT NULL,   -- ok | error
    text               VARCHAR,
    output_token_ids   INTEGER[],
    finish_reason      VARCHAR,            -- stop | length | error
    num_prompt_tokens  INTEGER NOT NULL,
    num_output_tokens  INTEGER NOT NULL,
    num_cached_tokens  INTEGER,            -- prompt tokens served from the prefix cache
    error              VARCHAR,
    engine             VARCHAR NOT NULL,
    started_at         TIMESTAMPTZ,
    finished_at        TIMESTAMPTZ,
    PRIMARY KEY (run_id, request_id)
);

CREATE TABLE IF NOT EXISTS metrics (
    run_id      VARCHAR NOT NULL,
    name        VARCHAR NOT NULL,          -- e.g. wall_seconds, tokens_per_second, prefix_hit_rate
    value       DOUBLE NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE IF NOT EXISTS validation_results (
    run_id       VARCHAR NOT NULL,
    stage        VARCHAR NOT NULL,         -- input | input_counts | outputs
    expectation  VARCHAR NOT NULL,         -- great-expectations expectation type
    column_name  VARCHAR NOT NULL,         -- '' for table-level checks
    success      BOOLEAN NOT NULL,
    observed     VARCHAR,
    unexpected   VARCHAR,                  -- a few offending values, JSON
    checked_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, stage, expectation, column_name)
);

CREATE TABLE IF NOT EXISTS plan (
    run_id             VARCHAR NOT NULL,
    request_id         VARCHAR NOT NULL,
    shard              INTEGER NOT NULL,   -- data-parallel shard (-1: the warm-up task of older runs)
    position           INTEGER,            -- admission order inside the shard: the plan's where it fixes one,
                                           -- the order that ran once loaded (null before, where the shard orders)
    est_output_tokens  INTEGER NOT NULL,   -- the length assumed: the warm-up estimate once loaded, else max_tokens or known
    answered_by        VARCHAR NOT NULL,   -- the request whose inference answers it (itself if unique)
    PRIMARY KEY (run_id, request_id)
);
-- files made before positions could be null (a policy that orders inside its shards left them unset)
ALTER TABLE plan ALTER COLUMN position DROP NOT NULL;

CREATE TABLE IF NOT EXISTS samples (
    run_id                VARCHAR NOT NULL,
    request_id            VARCHAR NOT NULL,
    kind                  VARCHAR NOT NULL,  -- sampled | known | subtree | sibling | ancestor | no_sample
    source_node           BIGINT NOT NULL,   -- prefix-tree node whose samples gave the estimate
    est_output_tokens     INTEGER NOT NULL,  -- mean of the source's sampled lengths
    est_high_tokens       INTEGER NOT NULL,  -- a high quantile, for KV budgeting
    actual_output_tokens  INTEGER,           -- observed length of the sampled requests
    PRIMARY KEY (run_id, request_id)
);

-- Engine statistics per interval (keys documented in blendserve.engines.common.TIMELINE_KEYS).
CREATE TABLE IF NOT EXISTS engine_timeline (
    run_id           VARCHAR NOT NULL,
    shard            INTEGER NOT NULL,   -- data-parallel shard (-1: the warm-up task of older runs)
    t                DOUBLE,             -- seconds since the shard's run started (simulated for the simulator)
    steps            DOUBLE,
    running          DOUBLE,
    waiting          DOUBLE,
    kv_used_tokens   DOUBLE,
    kv_total_tokens  DOUBLE,
    prefill_tokens   DOUBLE,
    decode_tokens    DOUBLE,
    prefix_queries   DOUBLE,
    prefix_hits      DOUBLE,
    admitted         DOUBLE,
    finished         DOUBLE
);
