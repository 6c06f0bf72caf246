# nactuator — one obvious path: `make setup`, `make test`, `make train PLATFORM=so101`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export WANDB_MODE ?= offline

PLATFORM ?= so101
DATA ?=
ARGS ?=

.PHONY: setup test test-slow-sample test-all docs-check lint train pretrain bench notebook clean lerobot-env lerobot-check

setup:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install -c constraints.txt -e '.[dev,ray]'
	# LeRobot's motor buses: 0.4.4 is the newest release for Python 3.11. Its own pins
	# (torch<2.11) conflict with ours, so it goes in --no-deps, with what lerobot.motors imports.
	$(PIP) install -c constraints.txt --no-deps lerobot==0.4.4
	$(PIP) install -c constraints.txt accelerate==1.15.0 datasets==5.0.1 deepdiff==8.6.2 \
		'huggingface-hub>=0.35,<0.36' draccus==0.10.0
	$(PY) -c "import nactuator, warp, newton, lightning, ray, lerobot.motors.feetech, lerobot.motors.dynamixel; print('nactuator setup ok')"
	@echo "activate the environment to get the nactuator command: source $(VENV)/bin/activate"

# Two worker processes (pytest-xdist): the suite is one process's imports and child trainings
# end to end, so a second core halves it (worksteal: a worker that runs dry takes queued tests
# from the other, so one long test does not leave a core idle). TEST_JOBS=1 runs it in one
# process; auto uses every core.
TEST_JOBS ?= 2

test:
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=10

# A bounded sample of the slow tests (`.ci/run` runs it after `make test`; 339 s measured
# with the 2 cores at a load average of 6, DDP the longest at 104 s): DDP with 2 processes, the Newton closed-loop FD on every platform (the fast
# suite runs the chain engine's), the 20x Ctrl-C on the DYNAMIXEL bus,
# full-size export parity of the paper's transformer, `eval --baselines all` end to end,
# calibrate-arm on two emulated arms with Ctrl-C and resume, adapt's nested N = 1, 2, cv on a
# real 127.0.0.1 Ray head against the local pool. Named by id, so a renamed or removed
# test fails here instead of silently dropping out.
SLOW_SAMPLE := \
	tests/test_training_cli.py::test_ddp_two_cpu_processes \
	'tests/test_sim_grad.py::test_closed_loop_gradient_wrt_network_weights_matches_finite_differences[newton-omx]' \
	'tests/test_sim_grad.py::test_closed_loop_gradient_wrt_network_weights_matches_finite_differences[newton-so101]' \
	'tests/test_sim_grad.py::test_closed_loop_gradient_wrt_network_weights_matches_finite_differences[newton-franka]' \
	'tests/test_sim_grad.py::test_closed_loop_gradient_wrt_network_weights_matches_finite_differences[newton-pendulum]' \
	'tests/test_hardware_ctrl_c.py::test_sigint_at_random_moments_20_repetitions[dynamixel-omx]' \
	'tests/test_export.py::test_full_size_exports_match_eager[transformer]' \
	tests/test_baselines_eval.py::test_eval_cli_adds_one_row_per_baseline_to_every_table \
	tests/test_calibrate_arm.py::test_calibrate_arm_end_to_end_on_emulated_arms_with_ctrl_c_and_resume \
	'tests/test_adapt.py::test_adapt_writes_the_curve_and_n0_is_the_checkpoint[n1-n2]' \
	tests/test_distributed.py::test_cv_on_a_ray_cluster_gives_the_local_per_fold_figures

test-slow-sample:
	$(PY) -m pytest -q -m slow --durations=10 $(SLOW_SAMPLE)

test-all:
	$(PY) -m pytest -q -m ''

docs-check:
	$(PY) -m pytest -q -m readme tests/test_readme.py

lint:
	$(PY) -m ruff check src tests bench

train:
	$(PY) -m nactuator.cli train --platform $(PLATFORM) $(if $(DATA),--data $(DATA)) $(ARGS)

# The shipped pretrained actuator of PLATFORM (conf/pretrain/$(PLATFORM).yaml): synthetic worlds
# + the NAD files beside the checkout -> src/nactuator/pretrained/$(PLATFORM).{pt,md}
# (docs/training.md, "Pretrained actuators"). Resumes in runs/pretrain/$(PLATFORM).
pretrain:
	$(PY) -m nactuator.cli pretrain --platform $(PLATFORM) $(ARGS)

# The quickstart notebook, executed headless (~10 min): runs/quickstart/quickstart.ipynb keeps
# every output and plot (the committed notebook has none).
notebook:
	mkdir -p runs/quickstart
	$(PY) -c "import nbformat, nbclient; nb = nbformat.read('notebooks/quickstart.ipynb', as_version=4); nbclient.NotebookClient(nb, timeout=3600, kernel_name='python3', resources={'metadata': {'path': 'notebooks'}}).execute(); nbformat.write(nb, 'runs/quickstart/quickstart.ipynb'); print('wrote runs/quickstart/quickstart.ipynb')"

bench:
	$(PY) bench/sim.py && $(PY) bench/data.py && $(PY) bench/infer.py

# LeRobot's own dataset loader, tools and policies in a separate environment (torch 2.14.1 +
# torchvision 0.29.1, LeRobot 0.4.4 with its dependencies; 3-10 min and ~7 GB the first time):
# `make lerobot-check` writes a recording and a NAD import with OUR env, then opens, batches
# and trains one ACT step on each with LeRobot (docs/data-format.md, "Opening a dataset with
# LeRobot"). Needs `make setup` first.
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_CHECK_OUT ?= runs/lerobot-check

lerobot-env: $(LEROBOT_VENV)/.installed

$(LEROBOT_VENV)/.installed: tests/lerobot_check/requirements.txt tests/lerobot_check/constraints.txt
	$(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install --upgrade pip
	$(LEROBOT_VENV)/bin/python -m pip install -c tests/lerobot_check/constraints.txt \
		-r tests/lerobot_check/requirements.txt
	# LeRobot pins torch<2.11 / torchvision<0.26: installed --no-deps, its other
	# dependencies come from requirements.txt
	$(LEROBOT_VENV)/bin/python -m pip install --no-deps lerobot==0.4.4
	touch $@

lerobot-check: $(LEROBOT_VENV)/.installed
	$(PY) tests/lerobot_check/make_datasets.py $(LEROBOT_CHECK_OUT)
	$(LEROBOT_VENV)/bin/python tests/lerobot_check/open_with_lerobot.py $(LEROBOT_CHECK_OUT)

clean:
	rm -rf .cache build *.egg-info
