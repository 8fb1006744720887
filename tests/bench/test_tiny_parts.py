"""The pieces of the tiny modes and of the fault bench that decide something, without running a
model: what ``--tiny`` sets, how an experiment shrinks, and which line of a dead child's output
says why it stopped."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))  # the bench scripts import each other as the scripts they are

import faults  # noqa: E402
from _tiny import parse_args  # noqa: E402

from selective_rollout.analysis.experiment import TINY_RUN, load_experiment, tiny_experiment  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("overrides", nargs="*")
    return parser


def test_tiny_sets_the_small_defaults_but_an_option_given_wins():
    args = parse_args(_parser(), ["--tiny", "--steps", "3", "gate.k=2"], tasks=1, steps=1)
    assert (args.tasks, args.steps) == (1, 3)
    assert args.overrides == [*TINY_RUN, "gate.k=2"]  # the script's own overrides come last
    plain = parse_args(_parser(), ["gate.k=2"], tasks=1, steps=1)
    assert (plain.tasks, plain.steps, plain.overrides) == (24, 8, ["gate.k=2"])


def test_a_tiny_experiment_keeps_its_arms_on_one_seed_without_gate_memory(tmp_path):
    exp, _ = load_experiment(REPO / "configs" / "experiments" / "ab_gates_cpu.yaml")
    tiny = tiny_experiment(exp, tmp_path / "games")
    assert list(tiny.arms) == list(exp.arms) and tiny.seeds == exp.seeds[:1]
    assert exp.gate_memory and not tiny.gate_memory  # gate memory needs two seeds
    for arm, overrides in tiny.arms.items():  # the tiny sizes after the arm's own
        assert overrides == [*exp.arms[arm], *TINY_RUN, f"env.games_dir={tmp_path / 'games'}"]
    assert tiny.layers() == exp.layers()


def test_a_dead_childs_error_line_is_its_last_error_not_its_shutdown_noise():
    output = "\n".join(
        [
            "INFO selective_rollout.driver: policy: ...",
            "error: data/games/medium/train holds 0 of the 6 medium games (seed 0) the config names",
            "INFO ray: shutting down",
            "",
        ]
    )
    assert faults.error_line(output).startswith("error: data/games/medium/train holds 0 of the 6")
    assert faults.error_line("Traceback:\n  File x\nValueError: bad\nbye\n") == "ValueError: bad"
    assert faults.error_line("last words\n") == "last words"
    assert faults.error_line("") == "(no output)"
