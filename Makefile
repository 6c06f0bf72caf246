# nactuator — one obvious path: `make setup`, `make test`, `make train PLATFORM=so101`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export WARP_CACHE_PATH := $(CURDIR)/.cache/warp
export WANDB_MODE ?= offline

PLATFORM ?= so101
DATA ?=
ARGS ?=

.PHONY: setup test test-all docs-check lint train bench clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install -c constraints.txt -e '.[dev]'
	# LeRobot's motor buses: 0.4.4 is the newest release for Python 3.11. Its own pins
	# (torch<2.11) conflict with ours, so it goes in --no-deps, with what lerobot.motors imports.
	$(PIP) install -c constraints.txt --no-deps lerobot==0.4.4
	$(PIP) install -c constraints.txt accelerate==1.15.0 datasets==5.0.1 deepdiff==8.6.2 \
		'huggingface-hub>=0.35,<0.36' draccus==0.10.0
	$(PY) -c "import nactuator, warp, newton, lightning, lerobot.motors.feetech, lerobot.motors.dynamixel; print('nactuator setup ok')"
	@echo "activate the environment to get the nactuator command: source $(VENV)/bin/activate"

test:
	$(PY) -m pytest -q --durations=10

test-all:
	$(PY) -m pytest -q -m ''

docs-check:
	$(PY) -m pytest -q -m readme tests/test_readme.py

lint:
	$(PY) -m ruff check src tests bench

train:
	$(PY) -m nactuator.cli train --platform $(PLATFORM) $(if $(DATA),--data $(DATA)) $(ARGS)

bench:
	$(PY) bench/sim.py && $(PY) bench/data.py && $(PY) bench/infer.py

clean:
	rm -rf .cache build *.egg-info
