"""Whether a device multiplies bf16 natively, and what a config's ``...-if-native`` float format
resolves to there.

bf16 pays only where the hardware computes it: CUDA GPUs with bf16 (Ampere on), x86 CPUs with AMX
or AVX512-BF16, Arm CPUs whose oneDNN build has bf16 kernels. Elsewhere PyTorch emulates it: on a
2-core AVX2-only AMD EPYC (2026-12-03) a 1024x576x1536 bf16 matmul ran at 1.1 GFLOP/s against 110
for fp32. So the CPU profile asks for bf16 *if native*: one config is fast on both kinds of laptop,
and each engine and learner resolves it on its own device (a cluster's nodes may differ).
"""

from __future__ import annotations

import platform

import torch

IF_NATIVE = "-if-native"


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` ("cuda" or "cpu") of this process multiplies bf16 in hardware."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type != "cpu":
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        try:  # a build without oneDNN (macOS wheels, say) lacks the op: no native bf16 to use
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, probe, lambda: False)()) for probe in probes)


def resolve_format(value: str, fallback: str, device_type: str) -> str:
    """``value`` as it is, or for ``<format>-if-native`` that format where ``device_type`` has
    native bf16 and ``fallback`` elsewhere."""
    if not value.endswith(IF_NATIVE):
        return value
    return value.removesuffix(IF_NATIVE) if native_bf16(device_type) else fallback


def engine_dtype(value: str, device_type: str) -> str:
    """An engine's ``engine.dtype`` on ``device_type``: ``bfloat16-if-native`` falls back to float32."""
    return resolve_format(value, "float32", device_type)


def learner_precision(value: str, device_type: str) -> str:
    """A learner's ``trainer.precision`` on ``device_type``: ``bf16-mixed-if-native`` falls back to fp32."""
    return resolve_format(value, "fp32", device_type)


def this_device_type() -> str:
    """The device an engine or learner in this process computes on."""
    return "cuda" if torch.cuda.is_available() else "cpu"
