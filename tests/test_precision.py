"""``...-if-native`` float formats: bf16 only where the device multiplies it in hardware."""

from __future__ import annotations

import pytest
import torch

from selective_rollout import precision
from selective_rollout.precision import engine_dtype, learner_precision, native_bf16


@pytest.mark.parametrize("native", [True, False])
def test_if_native_formats_follow_the_device_and_explicit_ones_are_kept(monkeypatch, native):
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: native)
    assert engine_dtype("bfloat16-if-native", "cpu") == ("bfloat16" if native else "float32")
    assert learner_precision("bf16-mixed-if-native", "cpu") == ("bf16-mixed" if native else "fp32")
    for explicit in ("bfloat16", "float32", "auto"):
        assert engine_dtype(explicit, "cpu") == explicit
    for explicit in ("bf16-mixed", "bf16", "fp32"):
        assert learner_precision(explicit, "cpu") == explicit


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "native"), [(False, False, False), (True, False, True), (False, True, True)]
)
def test_an_x86_cpu_is_native_with_amx_or_avx512_bf16_only(monkeypatch, amx, avx512_bf16, native):
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert native_bf16("cpu") is native


def test_an_arm_cpu_asks_onednn_and_a_build_without_it_is_not_native(monkeypatch):
    monkeypatch.setattr(precision.platform, "machine", lambda: "arm64")

    class NoOneDNN:
        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(precision.torch.ops, "mkldnn", NoOneDNN())
    assert native_bf16("cpu") is False


def test_an_engine_on_a_cpu_without_native_bf16_loads_float32(monkeypatch, smollm2_path):
    from selective_rollout.config.engine import EngineConfig
    from selective_rollout.rollout.engines.transformers_engine import TransformersEngine

    monkeypatch.setattr(precision, "native_bf16", lambda device_type: False)
    engine = TransformersEngine(EngineConfig(dtype="bfloat16-if-native", threads=1), smollm2_path)
    assert next(engine.model.parameters()).dtype == torch.float32
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: True)
    engine = TransformersEngine(EngineConfig(dtype="bfloat16-if-native", threads=1), smollm2_path)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
