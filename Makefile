# The two commands of the README: `make train` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline

.PHONY: setup train test test-fast lint bench rehearse

setup:
	@VENV=$(VENV) bash scripts/setup_env.sh

train: setup
	$(PY) scripts/train.py $(ARGS)

test: setup
	$(PY) -m pytest $(ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow" $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# The GPU machine's device session replayed on this CPU (scripts/device/rehearse.sh; --quick runs in make test).
rehearse: setup
	PYTHON=$(PY) bash scripts/device/rehearse.sh $(ARGS)
