"""Config loads and validates in a process that cannot import what it configures: the registries
read each entry's ``Params`` without importing torch, Ray, the engines, the coordinator or the
environments' game engines (a dry run, a launcher or a CI check validates on any machine)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = (
    "torch",
    "ray",
    "vllm",
    "transformers",
    "deepspeed",
    "alfworld",
    "textworld",
    "selective_rollout.rollout.coordinator",
    "selective_rollout.rollout.engines.transformers_engine",
    "selective_rollout.rollout.engines.vllm_engine",
    "selective_rollout.learner.losses.policy",
    "alfworld_env.pool",
)

SCRIPT = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    FORBIDDEN = {forbidden!r}

    class Refuse(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                raise ImportError(f"config validation imported {{name}}")
            return None

    sys.meta_path.insert(0, Refuse())
    from pathlib import Path
    from selective_rollout.config import load_config

    overrides = [
        [],
        ["engine.backend=vllm", "engine.tensor_parallel_size=1"],
        ["env.name=tw-cooking", "env.level=easy"],
        ["gate.name=history"],
        ["gate.name=precision_target"],
        ["rollout.strategy=preskip", "rollout.preskip_window=2"],
        ["trainer.clip_high=0.3", "trainer.loss_agg=seq-mean-token-sum", "trainer.kl_estimator=k1"],
    ]
    import yaml

    for path in sorted(Path("configs").glob("*.yaml")):  # the run configs (experiments/ apart)
        assert "arms" not in yaml.safe_load(path.read_text()), path
        for extra in overrides:
            load_config(path, extra)
    print("validated")
    """
)


def test_every_shipped_config_validates_without_the_heavy_imports():
    script = SCRIPT.format(forbidden=FORBIDDEN)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("validated")


def test_the_check_itself_catches_a_heavy_import():
    script = SCRIPT.format(forbidden=(*FORBIDDEN, "selective_rollout.gate.stalled"))
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode != 0 and "imported selective_rollout.gate.stalled" in out.stderr
