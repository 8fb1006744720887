"""A rollout strategy added from outside the library: one class, its Params model and one
registration; no change to the config schema, the coordinator or the configuration reference."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from selective_rollout.config import ConfigError, dump_config, load_config
from selective_rollout.config.reference import render
from selective_rollout.gate.base import NoGate
from selective_rollout.records import Outcome
from selective_rollout.rollout.strategies import STRATEGIES, Strategy, StrategyParams
from tests.rollout.test_coordinator_unit import Coordinated, outcomes

TOY = "keep_first_n_test_only"


class KeepFirstNParams(StrategyParams):
    keep_first_n: int = Field(1, ge=1, description="groups kept for training; later ones are dropped")


class KeepFirstN(Strategy):
    """Trains on the first ``keep_first_n`` finished groups only (a toy), and records every call."""

    Params = KeepFirstNParams
    params: KeepFirstNParams

    def __init__(self, params: KeepFirstNParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.admitted: list[str] = []
        self.observed: list[tuple[str, bool | None]] = []
        self.kept = 0

    def admit(self, task_id: str) -> bool:
        self.admitted.append(task_id)
        return True

    def observe(self, task_id: str, zero_variance: bool | None) -> None:
        self.observed.append((task_id, zero_variance))

    def keep(self, zero_variance: bool) -> bool:
        self.kept += 1
        return self.kept <= self.params.keep_first_n


def assert_refused_in_one_line(overrides: list[str], match: str) -> None:
    """The overrides are refused with one line matching ``match`` (what a person at the CLI reads)."""
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


@pytest.fixture
def toy_strategy():
    STRATEGIES.register(TOY)(KeepFirstN)
    try:
        yield KeepFirstN
    finally:
        STRATEGIES.remove(TOY)


def test_config_selects_the_toy_and_validates_its_own_parameter(toy_strategy, tmp_path):
    cfg = load_config(None, [f"rollout.strategy={TOY}", "rollout.keep_first_n=2"])
    assert (cfg.rollout.strategy, cfg.rollout.keep_first_n) == (TOY, 2)
    assert load_config(None, [f"rollout.strategy={TOY}"]).rollout.keep_first_n == 1  # its default
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg
    strategy = cfg.rollout.build(seed=cfg.seed)
    assert isinstance(strategy, KeepFirstN) and strategy.params.keep_first_n == 2


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            [f"rollout.strategy={TOY}", "rollout.preskip_window=2"],
            rf"rollout\.preskip_window: strategy '{TOY}' has no such parameter \(preskip has\)",
        ),
        (
            ["rollout.keep_first_n=2"],
            rf"rollout\.keep_first_n: strategy 'selective' has no such parameter \({TOY} has\)",
        ),
        ([f"rollout.strategy={TOY}", "rollout.keep_frist_n=2"], r"rollout\.keep_frist_n: unknown key"),
        (
            [f"rollout.strategy={TOY}", "rollout.keep_first_n=0"],
            r"rollout\.keep_first_n must be >= 1 \(got 0\)",
        ),
        (["rollout.strategy=nope"], r"rollout\.strategy: unknown strategy 'nope'"),
    ],
)
def test_config_refuses_keys_the_selected_strategy_does_not_own(toy_strategy, overrides, match):
    assert_refused_in_one_line(overrides, match)


def test_the_coordinator_runs_the_toys_admit_observe_and_keep(toy_strategy):
    co = Coordinated(
        [
            f"rollout.strategy={TOY}",
            "rollout.keep_first_n=1",
            "rollout.groups_per_iteration=2",
            "rollout.max_groups_in_flight=1",
        ]
    )
    strategy = co.c.strategy
    assert isinstance(strategy, KeepFirstN) and isinstance(co.c.gate, NoGate)  # uses_gate is False
    batch = co.run(["converge_lose", "diverge_mixed", "converge_win"])
    assert outcomes(batch) == [
        ("converge_lose", Outcome.COMPLETED),
        ("diverge_mixed", Outcome.FILTERED),
        ("converge_win", Outcome.FILTERED),
    ]
    assert [t.split("-", 2)[2] for t in strategy.admitted] == [
        "converge_lose",
        "diverge_mixed",
        "converge_win",
    ]
    assert [(t.split("-", 2)[2], z) for t, z in strategy.observed] == [
        ("converge_lose", True),
        ("diverge_mixed", False),
        ("converge_win", True),
    ]


def test_a_gated_strategy_is_checked_against_the_gates_k_whatever_its_name(toy_strategy):
    class GatedToy(KeepFirstN):
        uses_gate = True

    STRATEGIES.register("gated_toy_test_only")(GatedToy)
    try:
        with pytest.raises(ConfigError, match="the gate would never look"):
            load_config(None, ["rollout.strategy=gated_toy_test_only", "gate.k=20", "rollout.max_steps=15"])
        load_config(None, [f"rollout.strategy={TOY}", "gate.k=20", "rollout.max_steps=15"])
    finally:
        STRATEGIES.remove("gated_toy_test_only")


def test_registration_refuses_a_name_twice_and_params_of_the_wrong_kind(toy_strategy):
    with pytest.raises(ValueError, match=f"strategy '{TOY}' is registered twice"):
        STRATEGIES.register(TOY)(KeepFirstN)

    class Plain(BaseModel):
        x: int = 1

    class Loose(Strategy):
        Params = Plain  # type: ignore[assignment]

    with pytest.raises(TypeError, match="Params must subclass StrategyParams"):
        STRATEGIES.register("loose_test_only")(Loose)
    assert "loose_test_only" not in STRATEGIES


def test_switching_strategy_over_a_file_drops_the_files_keys_of_the_replaced_one(tmp_path):
    base = tmp_path / "preskip.yaml"
    base.write_text("rollout:\n  strategy: preskip\n  preskip_window: 3\n")
    assert load_config(base).rollout.preskip_window == 3
    cfg = load_config(base, ["rollout.strategy=dapo"])
    assert cfg.rollout.strategy == "dapo" and not cfg.rollout.model_extra
    with pytest.raises(ConfigError, match=r"rollout\.preskip_window: strategy 'dapo' has no such"):
        load_config(base, ["rollout.strategy=dapo", "rollout.preskip_window=3"])


def test_the_reference_lists_the_toys_keys(toy_strategy):
    doc = render()
    assert (
        f"### `rollout.strategy: {TOY}`" in doc and "| `rollout.keep_first_n` | `int` | `1` | >= 1 |" in doc
    )
    assert "| `rollout.preskip_window` | `int` | `1` | >= 1 |" in doc
