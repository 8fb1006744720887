"""A gate added from outside the library: one class, its Params model and one registration; no
change to the config schema, the offline evaluator or the configuration reference."""

import csv

import pytest
from pydantic import Field

from selective_rollout.analysis.gate_eval.evaluate import main as evaluate
from selective_rollout.config import ConfigError, dump_config, load_config
from selective_rollout.config.reference import render
from selective_rollout.gate import GATES, Gate, GateDecision, GateParams, GroupView, register_gate
from tests.analysis.gate_eval.test_evaluate import write_example

TOY = "stop_at_step_test_only"


class StopAtStepParams(GateParams):
    min_step: int = Field(1, ge=1, description="stop every group that has reached this step")


class StopAtStep(Gate):
    """Stops any group once it has reached ``min_step`` (a toy: it ignores the actions)."""

    Params = StopAtStepParams
    params: StopAtStepParams

    def decide(self, group: GroupView) -> GateDecision:
        stop = group.step >= self.params.min_step
        return GateDecision(stop, f"step {group.step} vs min_step={self.params.min_step}")


@pytest.fixture
def toy_gate():
    register_gate(TOY)(StopAtStep)
    try:
        yield StopAtStep
    finally:
        GATES.remove(TOY)


def test_config_selects_the_toy_and_validates_its_own_parameter(toy_gate, tmp_path):
    cfg = load_config(None, [f"gate.name={TOY}", "gate.min_step=3", "gate.k=2", "gate.mode=from_k"])
    assert (cfg.gate.name, cfg.gate.k, cfg.gate.min_step) == (TOY, 2, 3)
    assert load_config(None, [f"gate.name={TOY}"]).gate.min_step == 1  # its own default is filled in
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            [f"gate.name={TOY}", "gate.tau=0.1"],
            rf"gate\.tau: gate '{TOY}' has no such parameter \(history, prefix_edit has\)",
        ),
        (["gate.min_step=3"], rf"gate\.min_step: gate 'prefix_edit' has no such parameter \({TOY} has\)"),
        ([f"gate.name={TOY}", "gate.min_stp=3"], r"gate\.min_stp: unknown key"),
        ([f"gate.name={TOY}", "gate.min_step=0"], r"gate\.min_step must be >= 1 \(got 0\)"),
        (["gate.name=oracle"], r"gate\.name: .*offline only"),
    ],
)
def test_config_refuses_keys_the_selected_gate_does_not_own(toy_gate, overrides, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_the_coordinator_builds_the_toy_from_the_config_and_it_decides(toy_gate):
    cfg = load_config(None, [f"gate.name={TOY}", "gate.min_step=3", "gate.k=2", "gate.mode=from_k"])
    gate = cfg.gate.build()  # GroupCoordinator.__init__ builds its gate this way
    assert isinstance(gate, StopAtStep) and gate.params.min_step == 3
    actions = [["go to sink 1", "look", "open drawer 1"], ["go to desk 1", "look", "take pen 1"]]
    assert gate.should_check(2) and not gate.decide(GroupView(actions, step=2)).stop
    assert gate.should_check(3) and gate.decide(GroupView(actions, step=3)).stop


def test_the_offline_evaluator_runs_the_toy(toy_gate, tmp_path):
    rollouts, out = tmp_path / "rollouts.jsonl", tmp_path / "eval"
    write_example(rollouts)
    argv = ["--rollouts", str(rollouts), "--out", str(out), "--k", "5", "--gates", TOY]
    assert evaluate([*argv, "--param", "min_step=3"]) == 0
    with (out / "gate_eval.csv").open() as fh:
        (row,) = [r for r in csv.DictReader(fh) if r["gate"] == TOY]  # no threshold: one row per K
    # at K = 5 >= min_step every labelled group is stopped: the 5 zero-variance ones and 4 mixed
    assert (row["tp"], row["fp"], row["fn"], row["tn"]) == ("5", "4", "0", "0")
    assert evaluate([*argv, "--param", "tau=0.1"]) == 2  # not a parameter of the requested gate


def test_the_reference_lists_the_toys_parameters(toy_gate):
    assert f"### `gate.name: {TOY}`" in render() and "| `gate.min_step` | `int` | `1` | >= 1 |" in render()


def test_a_threshold_must_be_one_of_the_gates_own_parameters():
    class Bad(Gate):
        threshold = "tau"

    with pytest.raises(TypeError, match="threshold 'tau' is not one of its own parameters"):
        register_gate("bad_test_only")(Bad)
    assert "bad_test_only" not in GATES
