"""The warm start shows its progress (issue 18: it once ran for a minute with no output)."""

from __future__ import annotations

from selective_rollout.config import load_config
from selective_rollout.sft import train_sft
from tests.learner.conftest import make_batch


def test_the_warm_start_shows_a_bar_per_epoch_unless_progress_is_off(smollm2_path, tmp_path, capsys):
    data = make_batch(0, {"a": [1.0, 1.0, 1.0]})
    cfg = load_config(None, ["warm_start.epochs=2", "trainer.micro_batch_tokens=64"])
    stats = train_sft(smollm2_path, data, cfg, tmp_path / "on")
    shown = capsys.readouterr().err
    assert "warm start epoch 1/2" in shown and "warm start epoch 2/2" in shown and "nll=" in shown
    assert stats  # it trained and reported
    quiet = load_config(None, ["warm_start.epochs=1", "logging.progress=false"])
    train_sft(smollm2_path, data, quiet, tmp_path / "off")
    assert "warm start epoch" not in capsys.readouterr().err
