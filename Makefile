# The two commands: `make serve` and `make test`. Both install into ./.venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install system-deps serve test lint check-deploy demo-model bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $@

# Debian packages the browser and Prometheus tests use (CI installs them; needs root or sudo).
system-deps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium prometheus >/dev/null

serve: install
	$(VENV)/bin/pcgtts serve

test: install check-deploy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -ra

lint: install
	$(VENV)/bin/ruff check .

# The deployment files, as written: the Dockerfile (hadolint, rules in .hadolint.yaml), the compose file
# (the compose specification's schema) and every Kubernetes resource (kubernetes-validate --strict; the
# overlays and the optional ServiceMonitor are checked by tests/test_deploy_manifests.py).
K8S_RESOURCES := $(filter-out %/kustomization.yaml,$(wildcard deploy/k8s/*.yaml))
check-deploy: install
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(VENV)/bin/kubernetes-validate --strict --quiet -k 1.29.0 $(K8S_RESOURCES)

# Rebuilds models/demo-en from scratch (hours on a 2-core CPU; resumable). The eval stage needs the
# `eval` extra and the hash-pinned wheels of recipes/demo/requirements-eval.txt.
demo-model: install
	$(PIP) install --quiet -e '.[eval]'
	$(PIP) install --quiet --require-hashes --no-deps -r recipes/demo/requirements-eval.txt
	$(VENV)/bin/pcgtts recipe demo
