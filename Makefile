# The two things a fresh machine needs: `make demo` (the main job) and `make test` (all tests).
# Both run `make setup` first, which is idempotent (seconds once everything is installed).
VENV := .venv
# Keep the working directory off sys.path: the folder operator/ would shadow the standard
# library's operator module for any `python -m` run from here.
export PYTHONSAFEPATH := 1
BIN := $(shell echo $${PDSCALE_CACHE:-$$HOME/.cache/pdscale})/k8s-v1.34.4/bin

.PHONY: setup test test-fast lint demo cluster down chart-sync e2e-kind image chart-package dynamo-venv \
	aiperf-venv bench-fidelity docs docs-serve docs-ref docker kind-node-image

setup:
	@e2e/setup

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# Lint, types, layering and every test tier (pure, control plane, Prometheus, e2e), the real
# Dynamo planner's and aiperf's included: their venvs are built here (minutes, once), and the
# tests that drive them fail rather than skip when they are missing. The 30 slowest phases
# (setup, call, teardown) close each report: where CI's time goes, run after run.
# tests/ runs on two pytest-xdist workers (TESTS_WORKERS=0: one process, one test at a time):
# a module stays on one worker (its fixtures built once; tests/conftest.py groups them, and the
# two aiperf modules share one sweep), each worker starts its own control plane, and the
# modules that wait on wall-clock (control plane, Prometheus, live engines) go first, the
# CPU-bound pure tests last, to even out the two ends.
# e2e/ runs two modules at once (a module per worker): each module has its own control plane,
# Prometheus and fleet, and spends its time waiting on load phases played in real time (a
# fraction of a core each: docs/develop/index.md, Test tiers), so two side by side keep the
# slack they have alone.
# The e2e tier runs beside tests/ (its report in out/test-e2e.log, printed after tests/'s):
# e2e/ holds 0.6 of a core, so the run takes as long as the longer tier instead of the sum of
# both; TIERS=one-after-the-other runs it after tests/. Both tiers run even when one fails,
# so that one report says everything that failed.
E2E_WORKERS ?= 2
TESTS_WORKERS ?= 2
TIERS ?= side-by-side
test: lint dynamo-venv aiperf-venv
	export PDSCALE_REQUIRE_DYNAMO=1 PDSCALE_REQUIRE_AIPERF=1 \
	PDSCALE_AIPERF=$$(bench/aiperf/setup_venv.sh); \
	e2e() { $(VENV)/bin/pytest e2e -n $(E2E_WORKERS) --dist loadfile --durations=30; }; \
	tests() { $(VENV)/bin/pytest tests -n $(TESTS_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=30; }; \
	case "$(TIERS)" in \
	side-by-side) mkdir -p out; e2e > out/test-e2e.log 2>&1 & e2e_pid=$$!; \
	  tests; tiers=$$?; \
	  wait $$e2e_pid || tiers=1; echo "[test] the e2e tier, run beside tests/:"; cat out/test-e2e.log ;; \
	one-after-the-other) tests; tiers=$$?; e2e || tiers=1 ;; \
	*) echo "TIERS is side-by-side or one-after-the-other, not $(TIERS)" >&2; exit 2 ;; \
	esac; \
	exit $$tiers

# The pure tier alone: no control plane, no Prometheus, no live engines (tests/ minus the
# cluster, prometheus and slow markers). The check to run while editing. On two pytest-xdist
# workers: 92 s on a quiet 2-core machine, 166 s in one process (2026-12-07, 1,760 tests).
test-fast: setup
	$(VENV)/bin/pytest tests -q -n 2 -m "not cluster and not prometheus and not slow"

# A live, time-compressed run of the simulated engines behind the real router against its
# replay (bench/engine_fidelity.py): a measurement that load on the machine moves, so a
# benchmark (table on stdout, out/engine_fidelity.json) rather than a test.
bench-fidelity: setup
	$(VENV)/bin/python bench/engine_fidelity.py --out out/engine_fidelity.json

# aiperf 0.13.0 in a venv of its own (about 1 GB; not a pdscale dependency), for the closed-loop
# `pdscale profile run` tests.
aiperf-venv:
	bench/aiperf/setup_venv.sh > /dev/null

# The docs site (MkDocs + Material, from .venv as make setup installs it): built strictly into
# out/site (a broken link or a page missing from the nav fails), or served with live reload.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# Regenerate docs/reference/ from the code (the CRD, argparse, the chart's values, the metrics,
# the profile model); tests/docs/test_reference.py fails when they drift.
docs-ref: setup
	$(VENV)/bin/python tools/docsgen.py

# NVIDIA Dynamo 1.6.1's planner in a venv of its own (it pins an older kubernetes client).
dynamo-venv:
	bench/dynamo/setup_venv.sh

# The whole loop here: cluster, Prometheus, chart, operator, real router, simulated fleet,
# a phased load; ends with out/demo/demo.png and a summary.
demo: setup
	$(VENV)/bin/pdscale demo --out out/demo

# Just the local control plane with 24 fake 8xH200 nodes, left running.
cluster: setup
	$(VENV)/bin/pdscale cluster up --nodes 24
	KUBECONFIG=$$HOME/.local/state/pdscale/cluster/admin.kubeconfig $(BIN)/kubectl get nodes -L nvidia.com/gpu.product | head -8
	@echo "... use it:  export KUBECONFIG=$$HOME/.local/state/pdscale/cluster/admin.kubeconfig ; stop it:  make down"

down:
	$(VENV)/bin/pdscale cluster down

# Copy the single sources (the CRD generated from the spec model, the operator's RBAC rules)
# into the Helm chart; tests/chart fails when they drift.
chart-sync: setup
	cp crds/pdclusters.pdscale.io.yaml crds/pdpools.pdscale.io.yaml charts/pdscale/crds/
	for part in namespaced cluster watching; do $(VENV)/bin/python -c "import json, sys, yaml; \
	from pdscale.operator.render import rbac; rules = getattr(rbac, sys.argv[1] + '_rules')(); \
	print(yaml.safe_dump(json.loads(json.dumps(rules)), sort_keys=False), end='')" $$part \
	> charts/pdscale/rbac-$$part-rules.yaml; done

# The operator image ghcr.io/pdscale/pdscale-operator:<version> as an OCI archive,
# out/image/pdscale-operator-<version>.oci.tar, built here without Docker (mmdebstrap + umoci,
# as root); nothing to do when its inputs are unchanged. With Docker: image/Containerfile.
image:
	image/build

# The chart as out/chart/pdscale-<version>.tgz (its appVersion is the image's tag).
chart-package: setup
	$(BIN)/helm package charts/pdscale --destination out/chart

# Docker for the kind tier (e2e/docker/setup): installs Debian's docker.io and starts dockerd
# where missing (with a runtime wrapper where privileged containers need one); where Docker
# cannot run, one line says why the kind tier is skipped (exit 3).
docker:
	@e2e/docker/setup

# The kind tier (docs/develop/kind.md): Docker, a kind node image built here from Debian
# packages and Go modules (cached by its inputs), a kind cluster from it with a real kubelet,
# the operator image loaded and the chart installed with helm, then the cluster deleted.
# Skipped with one line where Docker cannot run. Step times: out/kind/times.txt.
KIND_KUBECONFIG ?= $(CURDIR)/out/kind/kubeconfig
e2e-kind: setup
	KIND_KUBECONFIG=$(KIND_KUBECONFIG) nice -n 10 e2e/kind/run

# The kind node image alone (prints its reference).
kind-node-image: docker
	nice -n 10 e2e/kind/node/build
