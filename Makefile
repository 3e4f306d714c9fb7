# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Set-up is idempotent: the stamps below are rebuilt only when the pinned files change.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov --compact --quiet --skip-download
PYTHON ?= python3
DEMO_DIR ?= out/demo
DEMO_STEPS ?=

export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export CDK_DISABLE_CLI_TELEMETRY := true
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup synth synth-cdk synth-k8s demo test lint bench checkov clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

node_modules/.installed: package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: synth-cdk synth-k8s

synth-cdk: setup
	npx cdk synth --quiet

# CDK8S_CHECK_UPGRADE is set on this line only: the CDK CLI reads every CDK* variable as an option.
synth-k8s: setup
	CDK8S_CHECK_UPGRADE=false npx cdk8s synth

demo: synth
	$(PY) -m workloads.fsdp_finetune --local --output-dir $(DEMO_DIR) $(if $(DEMO_STEPS),--max-steps $(DEMO_STEPS))

test: setup
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check .

bench: setup
	for b in bench/*.py; do [ "$$b" = bench/gpu_throughput.py ] || $(PY) $$b || exit 1; done

# checkov on what the project authors: the manifests plus the Ray pods inside the RayCluster and RayJob
# (charts/scan.py), and the CloudFormation templates. Its own venv: checkov's dependencies are not ours.
# Accepted findings are acknowledged inline (checkov.io/skipN annotations, Metadata.checkov.skip).
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-checkov.txt
	touch $@

checkov: synth $(CHECKOV_VENV)/.installed
	$(PY) -m charts.scan dist out/checkov
	$(CHECKOV) --framework kubernetes -d out/checkov
	$(CHECKOV) --framework cloudformation -d cdk.out

clean:
	rm -rf cdk.out dist out .pytest_cache
