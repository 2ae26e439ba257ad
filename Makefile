# pgcli developer commands. `make train` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PGCLI := $(VENV)/bin/pgcli
# The CPU wheel goes in first: with no torch present, a plain `torch` requirement resolves to the newest CUDA build
# (several GB). Once this version is installed, the package's `torch>=2.13` floor (this version) is satisfied.
TORCH_VERSION ?= 2.13.0
# `make train` installs pgcli alone (what the default run needs: PPO on CartPole, MLflow on SQLite); `make test`,
# `make lint` and `make install` add the extras the test suite needs (TEST_EXTRAS) on top, in the same .venv.
TEST_EXTRAS ?= dev,sweep,ray,lm,pixels,envpool
# Test processes (pytest-xdist): most tests wait on a real `pgcli` subprocess, a server or a browser, so two workers
# overlap those waits (2 cores: 20.7 min in one process, 16.3 min in two with benchmark runs beside them).
TEST_WORKERS ?= 2

.PHONY: install install-base train test test-fast lint format ui clean bench ray-up ray-down browser-deps

# Two stamps: .installed (pgcli and its own dependencies) and .installed-test (the extras on top), so `make test` after
# `make train` adds only the extras.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip uv
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	# uv resolves and installs the rest ~5x faster than pip; the installed torch already satisfies torch>=2.13.
	# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (as on CI) Python never
	# caches them either, so every `pgcli` process would compile MLflow, SQLAlchemy, Hydra, gymnasium... from source
	# again (about 3.5 s more to open an MLflow store). pgcli's own modules are compiled for the same reason.
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -e .
	$(PY) -m compileall -q pgcli hydra_plugins >/dev/null
	# hydra-optuna-sweeper (and its Optuna 2.10) is retired: pgcli ships hydra/sweeper=optuna itself. An older .venv
	# still has it, and both plugins would claim hydra/sweeper=optuna.
	$(VENV)/bin/uv pip uninstall -q --python $(PY) hydra-optuna-sweeper 2>/dev/null || true
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -e ".[$(TEST_EXTRAS)]"
	touch $@

install-base: $(VENV)/.installed  ## create .venv with pgcli alone (what `make train` and `make ui` install)

install: $(VENV)/.installed-test  ## .venv with pgcli and the extras the tests need: dev, sweep, ray, lm, pixels, envpool

train: install-base  ## train the default agent (PPO on CartPole, ~1 min); pass overrides with ARGS="algo=trpo seed=1"
	$(PGCLI) train $(ARGS)

test: install  ## the CI command: the whole default suite; a test file stays on one worker (TEST_WORKERS=1: one process)
	$(PY) -m compileall -q pgcli hydra_plugins >/dev/null  # edited modules: compiled once, not in every subprocess
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The UI test (tests/integration/test_ui.py) drives Debian's chromium through chromedriver; it is skipped, saying so,
# where they are missing. CI (.ci/run) installs them first. Needs root (or sudo) and apt.
browser-deps:  ## install chromium + chromedriver for the headless-browser test of `pgcli ui`
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then echo "chromium and chromedriver present"; \
	else $$(command -v sudo) apt-get update -q && DEBIAN_FRONTEND=noninteractive $$(command -v sudo) apt-get install -y -q --no-install-recommends chromium chromium-driver; fi

test-fast: install  ## unit and config tests only (seconds)
	$(PY) -m pytest -q tests/unit tests/config

lint: install  ## ruff format check, ruff lint, mypy
	$(VENV)/bin/ruff format --check pgcli hydra_plugins tests benchmarks
	$(VENV)/bin/ruff check pgcli hydra_plugins tests benchmarks
	$(VENV)/bin/mypy pgcli

format: install
	$(VENV)/bin/ruff format pgcli hydra_plugins tests benchmarks
	$(VENV)/bin/ruff check --fix pgcli hydra_plugins tests benchmarks

ui: install-base  ## MLflow UI on the embedded store (http://127.0.0.1:5000)
	$(PGCLI) ui

clean:  ## remove run directories and caches (keeps outputs/mlflow.db: use `make clean-store` for that)
	rm -rf outputs/runs outputs/sweeps multirun .pytest_cache .ruff_cache .mypy_cache MUJOCO_LOG.TXT
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +

clean-store:
	rm -rf outputs/mlflow.db outputs/mlartifacts

RAY_PORT ?= 6379
RAY_DIR ?= outputs/ray
ray-up: install  ## start a local Ray head on 127.0.0.1:$(RAY_PORT) for hydra/launcher=ray (pid/log in $(RAY_DIR)/; creates ~/.ray/auth_token if missing)
	$(PY) -m hydra_plugins.pgcli_ray_launcher.head up --port $(RAY_PORT) --dir $(RAY_DIR)

ray-down:  ## stop the head that `make ray-up` started (only that one; `ray stop` would end every Ray on the machine)
	$(PY) -m hydra_plugins.pgcli_ray_launcher.head down --dir $(RAY_DIR)
