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
VERBOSE ?=

# Node.js majors that jsii (the runtime of the CDK and cdk8s libraries, pinned in requirements.txt)
# supports; docs/setup.md "Node.js". `make setup` says in one line when the Node found is outside them, so
# jsii's multi-line banner, which would repeat it on every synth, is silenced for that version.
NODE_SUPPORTED := 22 24
# The same list as charts/__main__.py JSII_SUPPORTED_NODE (tests/test_cdk8s_cli.py keeps them equal).
NODE_MAJOR := $(shell node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := $(NODE_MAJOR)
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export CDK_DISABLE_CLI_TELEMETRY := true
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Python caches compiled bytecode (__pycache__/, ignored by git) even where the shell sets PYTHONDONTWRITEBYTECODE:
# without it every pytest run, Ray worker and CLI subprocess recompiles torch, Ray and the project from source, and
# pytest rewrites every test module again. Measured here: `make check` 87 s with it set, 55 s without (2 cores).
unexport PYTHONDONTWRITEBYTECODE

# Every target takes the variable file as CONFIG=FILE (else $CLUSTER_CONFIG, else config/cluster.yaml), the same
# file the Python commands take as their first argument.
ifdef CONFIG
export CLUSTER_CONFIG := $(abspath $(CONFIG))
endif

.PHONY: help ec2-test cluster-test cluster-real tier-packages setup tools node-check prometheus synth synth-cdk synth-k8s synth-ec2 demo test check lint bench checkov pyarrow-oldest clean

# `make help`: every target, one line each (the `## ` text on its line; tests/test_make_help.py keeps it complete).
help: ## list every target, one line each
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-zA-Z0-9_-]+):.*## (.*)$$/\1\t\2/' | \
	  awk -F'\t' '{ printf "  %-16s %s\n", $$1, $$2 }'

# When this make started: `make setup` ends with the time it took.
SETUP_START := $(shell date +%s)

# Every pinned upstream artifact the tests and the synth read (Helm charts, KubeRay CRDs, the add-on schema): from
# ../shared when present, else downloaded into .cache/pins/; each checked against its SHA-256 (tools/pins.py).
setup: tools prometheus ## install everything (Python venv with uv, Node CLIs, Prometheus, pinned charts and CRDs)
	@$(PY) -m tools.pins
	@echo "setup: ready ($$(( $$(date +%s) - $(SETUP_START) )) s in this make)"

# What the local fine-tune needs: no CRDs.
tools: node-check $(VENV)/.installed node_modules/.installed ## the Python venv and the Node CLIs only (what the local fine-tune needs)

# Debian's Prometheus server and promtool (2.42) for the local scrape test (tests/test_observability.py,
# docs/observability.md), and its node exporter (1.5.0) for the EFA counters test (tests/test_efa_counters.py):
# installed only when missing, and only where apt-get can run (root, or sudo without a password); otherwise one
# line says so and those tests skip with the same advice.
PROMETHEUS_PACKAGES := prometheus prometheus-node-exporter
prometheus: ## Debian's Prometheus and node exporter, for the scrape tests (apt-get, only when missing)
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	  command -v prometheus-node-exporter >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else \
	  echo "note: prometheus not installed and apt-get needs root; run: sudo apt-get install $(PROMETHEUS_PACKAGES)"; \
	  exit 0; fi; \
	if ! command -v apt-get >/dev/null; then echo "note: no apt-get; install Prometheus 2.x with promtool" \
	  "and node_exporter as prometheus-node-exporter"; exit 0; fi; \
	echo "setup: installing $(PROMETHEUS_PACKAGES) with apt-get (about 30 s)"; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends $(PROMETHEUS_PACKAGES) >/dev/null || \
	  echo "note: apt-get install $(PROMETHEUS_PACKAGES) failed; their tests skip"

node-check: ## say whether the Node.js found is one jsii supports
	@v=$$(node --version 2>/dev/null) || { echo "error: Node.js not found; install Node.js $(firstword $(NODE_SUPPORTED)) or $(lastword $(NODE_SUPPORTED)) (docs/setup.md: Node.js)" >&2; exit 1; }; \
	major=$${v#v}; major=$${major%%.*}; \
	if [ "$$major" -lt $(firstword $(NODE_SUPPORTED)) ]; then \
	  echo "note: Node.js $$v is past end of life; jsii (CDK, cdk8s) supports Node.js $(firstword $(NODE_SUPPORTED)) and $(lastword $(NODE_SUPPORTED)): please upgrade"; \
	elif [ "$$major" -gt $(lastword $(NODE_SUPPORTED)) ]; then \
	  echo "note: Node.js $$v is newer than jsii (CDK, cdk8s) has been tested with ($(firstword $(NODE_SUPPORTED)) and $(lastword $(NODE_SUPPORTED)))"; \
	fi

# uv installs the same pins as pip, 3.9x faster here (bench/setup_install.py); tools/install.py says what it
# installs and prints a line at least every 10 s while it works.
$(VENV)/.installed: requirements.txt
	@$(PYTHON) tools/install.py --python $(PYTHON) $(VENV) requirements.txt \
	  --what "torch, Ray, the CDK and cdk8s libraries: about 2 GB unpacked; 45 s measured on 2 cores from local wheels"
	@touch $@

node_modules/.installed: package-lock.json
	@$(PYTHON) tools/install.py --run "setup: npm ci (the cdk and cdk8s CLIs)" -- npm ci --no-audit --no-fund --loglevel=error
	@touch $@

synth: synth-cdk synth-k8s synth-ec2 ## synthesize all three: CloudFormation, Kubernetes manifests, the EC2 target

synth-cdk: setup ## CloudFormation templates into cdk.out/
	npx cdk synth --quiet

# The EC2 target (docs/ec2.md): the bundled EC2 example (config/examples/ec2/cluster.yaml, `target: ec2`; CONFIG=FILE
# for another), its stacks, and the `ray up` YAML rendered from an example of the stacks' outputs
# (config/examples/ec2/outputs.json; after a real deploy: python -m ops.launcher render --deployed).
EC2_DIR ?= out/ec2
EC2_CONFIG := $(or $(CLUSTER_CONFIG),$(abspath config/examples/ec2/cluster.yaml))
# A file the EC2 target refuses (an EKS capacity block, say) skips this step with the reason: `python -m config
# check` prints the same note, so a file check passes always synthesizes (config/target.py).
synth-ec2: setup ## the EC2 target's stacks and its ray up YAML into out/ec2/ (config/examples/ec2/cluster.yaml unless CONFIG)
	@if ! why=$$(CLUSTER_CONFIG=$(EC2_CONFIG) $(PY) -m config suits ec2 2>&1); then \
	  echo "synth-ec2: skipped, the EC2 target refuses this file: $$why"; \
	else CLUSTER_CONFIG=$(EC2_CONFIG) npx cdk synth --quiet -c target=ec2 -o $(EC2_DIR)/cdk.out && \
	  $(PY) -m ops.launcher render $(EC2_CONFIG) --outputs config/examples/ec2/outputs.json --out-dir $(EC2_DIR); fi

# CDK8S_CHECK_UPGRADE is set on this line only: the CDK CLI reads every CDK* variable as an option.
synth-k8s: setup ## the RayCluster and RayJob manifests into dist/
	CDK8S_CHECK_UPGRADE=false npx cdk8s synth

# The synth's own output goes to a log (its tail shown if it fails); the console keeps the training's story. The
# fine-tune needs neither the CRDs nor the synth: it runs either way, and a failed synth fails the target after it.
demo: tools ## set-up, synthesis, then a real local fine-tune on CPU (out/demo/)
	@mkdir -p $(DEMO_DIR)
	@synth=ok; : > $(DEMO_DIR)/synth.log; \
	$(PYTHON) tools/install.py --run "synthesizing (CDK, cdk8s, the EC2 target)" --log $(DEMO_DIR)/synth.log -- \
	  $(MAKE) -s --no-print-directory synth || synth=failed; \
	if [ $$synth = ok ]; then \
	  echo "synthesized cdk.out/ (CloudFormation), dist/ (Kubernetes manifests) and out/ec2/ (the EC2 target's stacks" \
	    "and ray up YAML); log in $(DEMO_DIR)/synth.log"; \
	else tail -n 15 $(DEMO_DIR)/synth.log; \
	  echo "make demo: synthesis failed (log: $(DEMO_DIR)/synth.log); running the local fine-tune anyway" >&2; fi; \
	$(PY) -m workloads.fsdp_finetune --local --output-dir $(DEMO_DIR) $(if $(DEMO_STEPS),--max-steps $(DEMO_STEPS)) \
	  $(if $(VERBOSE),--verbose) || exit $$?; \
	if [ $$synth = failed ]; then echo "make demo: the fine-tune ran, but synthesis failed: $(DEMO_DIR)/synth.log" >&2; \
	  exit 1; fi

# Two processes (pytest-xdist): on two cores they overlap one module's waits (process starts, Ray's polls)
# with another's work; a module runs whole in one process (tests/conftest.py). TEST_WORKERS=1 runs serially.
# The oldest pinned pyarrow is installed first, so tests/test_pyarrow_s3.py runs it too instead of skipping.
TEST_WORKERS ?= 2
# checkov's venv too: tests/test_checkov.py runs `make checkov`'s two scans (CloudFormation, Kubernetes) in the suite.
test: setup pyarrow-oldest $(CHECKOV_VENV)/.installed tier-packages ## the whole suite (two pytest processes); counts per tier at the end
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# The cluster tier (tests/cluster/): the real control plane and KubeRay operator of ../shared/k8s (or $$K8S_LAB),
# every example's dist/ applied and placed, the failure scenarios; writes dist/cluster-report.json. Also part of
# `make test`; here a missing lab fails instead of skipping (tests/k8s_lab.py HOW_TO_GET says how to get it).
cluster-test: setup ## the cluster tier alone: real control plane + KubeRay operator, examples, failure scenarios
	CLUSTER_TIER_REQUIRED=1 $(PY) -m pytest -m cluster tests/cluster

# The edit loop: every test not marked slow (pyproject.toml `markers`), in under a minute; CI runs `make test`.
check: setup ## the fast subset (not marked slow), under a minute: the edit loop
	$(PY) -m pytest -q -m "not slow"

lint: setup ## ruff
	$(PY) -m ruff check .

bench: setup ## the CPU benchmarks under bench/ (prints figures; the GPU one, newcomer.py, setup_install.py by hand)
	for b in bench/*.py; do case $$b in bench/gpu_throughput.py|bench/newcomer.py|bench/setup_install.py) ;; \
	  *) $(PY) $$b || exit 1;; esac; done

# checkov on what the project authors: the manifests plus the Ray pods inside the RayCluster and RayJob
# (ops/scan.py), and the CloudFormation templates. Its own venv: checkov's dependencies are not ours.
# Accepted findings are acknowledged inline (checkov.io/skipN annotations, Metadata.checkov.skip).
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-checkov.txt
	touch $@

checkov: synth $(CHECKOV_VENV)/.installed ## checkov on the manifests, the Ray pods and the templates
	$(PY) -m ops.scan dist out/checkov
	$(CHECKOV) --framework kubernetes -d out/checkov
	$(CHECKOV) --framework cloudformation -d cdk.out
	$(CHECKOV) --framework cloudformation -d $(EC2_DIR)/cdk.out

# pyarrow 24.0.0 (the oldest the image could carry) in its own venv, for tests/test_pyarrow_s3.py.
PYARROW_OLDEST_VENV := .venv-pyarrow-oldest
pyarrow-oldest: $(PYARROW_OLDEST_VENV)/.installed ## the oldest pinned pyarrow in its own venv (make test runs its S3 tests)
$(PYARROW_OLDEST_VENV)/.installed: requirements-pyarrow-oldest.txt
	@$(PYTHON) tools/install.py --python $(PYTHON) $(PYARROW_OLDEST_VENV) requirements-pyarrow-oldest.txt \
	  --what "pyarrow 24.0.0, 47 MB"
	@touch $@

clean: ## remove cdk.out/, dist/ and out/ (the demo's run too)
	rm -rf cdk.out dist out .pytest_cache

# The EC2 target's `ray up` tier alone (tests/test_ec2_rayup.py, docs/ec2.md "The ray up tier"): Ray's own
# `ray up`/`exec`/`job submit`/`down` against namespace hosts with real sshd and dockerd. Root, with docker.io,
# openssh-server, openssh-client, rsync, debootstrap and iproute2 installed (.ci/run installs them).
ec2-test: tools ## the EC2 target's ray up tier alone (root; real sshd and dockerd in network namespaces)
	$(PY) -m pytest -q -m ec2_tier tests/test_ec2_rayup.py

# The real-node tier (docs/cluster-tier.md): the project's RayJob through the real KubeRay 1.7.0 operator on a real
# kubelet node (../shared/k8s, ../shared/k8s-node), checkpoints to a local S3 server, then the head pod lost mid-run.
# Needs root and Debian's packages below; `make test` runs it too (tests/cluster_real, marked slow and cluster_real).
# The ray up tier adds sshd, the ssh client, rsync, iproute2 (network namespaces) and zsh (its SSM proxy test).
TIER_PACKAGES := docker.io containernetworking-plugins dnsmasq-base iptables debootstrap xz-utils \
  openssh-server openssh-client rsync iproute2 zsh
tier-packages: ## the Debian packages of the tiers with real daemons (root; .ci/run runs it)
	@missing=; for p in $(TIER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else \
	  echo "note: the real-daemon tiers need root and:$$missing (sudo apt-get install$$missing)"; exit 0; fi; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends $$missing >/dev/null

cluster-real: setup tier-packages ## the real-node tier alone: the project's RayJob on a real kubelet node, head pod lost
	CLUSTER_TIER_REQUIRED=1 $(PY) -m pytest tests/cluster_real -m cluster_real -p no:cacheprovider -s
