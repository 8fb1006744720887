"""A third party plugs in from its own package, without editing this one: a gate, a rollout
strategy and a policy loss declared as entry points of the registries' groups in the package's
metadata. The package is written to a temporary folder put on a subprocess's path (never
installed into the environment the tests run in)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = textwrap.dedent(
    '''
    """A toy plugin package."""
    import torch
    from pydantic import Field

    from selective_rollout.gate.base import Gate, GateDecision, GateParams, GroupView
    from selective_rollout.rollout.strategies import Strategy
    from selective_rollout.learner.losses.policy import PolicyLoss


    class EveryOtherParams(GateParams):
        every: int = Field(2, ge=1, description="stop groups at steps divisible by this")


    class EveryOther(Gate):
        """Stops a group at a step divisible by ``every`` (a toy)."""

        Params = EveryOtherParams

        def decide(self, group: GroupView) -> GateDecision:
            return GateDecision(group.step % self.params.every == 0, "toy")


    class KeepAll(Strategy):
        """Keeps everything and consults the gate (a toy)."""

        uses_gate = True


    class Reinforce(PolicyLoss):
        """-scale * A * log pi (a toy)."""

        toy_scale: float = Field(1.0, gt=0.0, description="toy_reinforce: multiplies the loss")

        def __call__(self, logprobs, old_logprobs, advantages, behaviour_logprobs):
            return -self.toy_scale * advantages * logprobs, torch.zeros_like(logprobs, dtype=torch.bool)
    '''
)

ENTRY_POINTS = textwrap.dedent(
    """
    [selective_rollout.gates]
    every_other = toy_plugin:EveryOther

    [selective_rollout.strategies]
    keep_all = toy_plugin:KeepAll

    [selective_rollout.policy_losses]
    toy_reinforce = toy_plugin:Reinforce
    """
)

CHECK = textwrap.dedent(
    """
    import torch
    from selective_rollout.config import load_config
    from selective_rollout.gate.base import GroupView
    from selective_rollout.gate.base import GATES
    from selective_rollout.learner.losses import POLICY_LOSSES
    from selective_rollout.rollout.strategies import STRATEGIES

    cfg = load_config(
        "configs/cpu_default.yaml",
        ["gate.name=every_other", "gate.every=3", "gate.k=3", "rollout.strategy=keep_all",
         "trainer.policy_loss=toy_reinforce", "trainer.toy_scale=2.0"],
    )
    gate = cfg.gate.build()
    assert gate.decide(GroupView([["a"], ["b"]], step=3)).stop
    assert not gate.decide(GroupView([["a"], ["b"]], step=4)).stop
    assert cfg.rollout.uses_gate and cfg.rollout.build(seed=0).keep(True)
    loss = POLICY_LOSSES.build(cfg.trainer.policy_loss, cfg.trainer)
    out, _ = loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert loss.toy_scale == 2.0 and out.shape == (1, 2)
    print("plugged in:", sorted(set(GATES) & {"every_other"}), sorted(set(STRATEGIES) & {"keep_all"}))
    """
)


def test_a_package_of_its_own_registers_a_gate_a_strategy_and_a_loss(tmp_path):
    site = tmp_path / "site"
    (site / "toy_plugin").mkdir(parents=True)
    (site / "toy_plugin" / "__init__.py").write_text(PLUGIN)
    dist = site / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "plugged in: ['every_other'] ['keep_all']" in out.stdout

    # without the package on the path, the names are unknown, with a "did you mean" for a typo
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            "from selective_rollout.config import load_config; load_config(None, ['gate.name=staled'])",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "unknown gate 'staled' (did you mean 'stalled'?)" in plain.stderr
