#!/usr/bin/env bash
# Run the vLLM engine tests in their own venv (tests/vllm/venv.sh builds it on first use); then
# only the tests run (engine start 2-8 min on CPU, torch.compile warm-up). Usage: tests/vllm/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/vllm/venv.sh
exec "${VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -m vllm tests/vllm -p no:cacheprovider "$@"
