"""Config loading: YAML + dotted overrides, strict validation with one clear error line."""

import logging

import pytest

from selective_rollout.config import ConfigError, RunConfig, dump_config, load_config


def test_overrides_apply_over_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: demo\ngate:\n  tau: 0.2\n  k: 5\n")
    cfg = load_config(path, ["gate.tau=0.1", "rollout.group_size=4"])
    assert (cfg.name, cfg.gate.tau, cfg.gate.k, cfg.rollout.group_size) == ("demo", 0.1, 5, 4)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["gate.tua=0.1"], r"gate\.tua: unknown key"),
        (["gate.tau=1.5"], r"gate\.tau must be <= 1\.0 \(got 1\.5\)"),
        (["gate.k=abc"], r"gate\.k: .*integer"),
        (["rollout.group_size=1"], r"rollout\.group_size"),
        (["nonsense"], "section.key=value"),
        (["trainer.adam_betas=[2.0,0.999]"], r"trainer\.adam_betas: .*each beta must be in \[0, 1\)"),
        (["engine.temperature=1e-45"], r"engine\.temperature: .*0 \(greedy\) or in \[0\.01, 100\.0\]"),
        (["env.preset=huge"], r"env\.preset: .*unknown preset 'huge'; expected one of \['full', 'medium'"),
        (["env.preset=tiny+"], r"env\.preset: .*unknown preset 'tiny\+'"),
        (
            ["gate.observe_logs=[/nowhere/rollouts.jsonl]"],
            r"gate\.observe_logs: .*no such rollouts log: /nowhere",
        ),
    ],
)
def test_bad_values_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        # driver: is the driver, trainer: the learner: a key put in the other one is pointed there
        ("driver.lr=1e-5", "driver.lr: unknown key (did you mean trainer.lr or warm_start.lr?)"),
        # the driver's section under its old name is read as the driver's
        ("train.lr=1e-5", "driver.lr: unknown key (did you mean trainer.lr or warm_start.lr?)"),
        ("trainer.iterations=3", "trainer.iterations: unknown key (did you mean driver.iterations?)"),
        ("rollout.group_sise=3", "rollout.group_sise: unknown key (did you mean rollout.group_size?)"),
        # an entry's own parameter (the prefix_edit gate's tau) is a key of its section too
        ("gate.taux=0.1", "gate.taux: unknown key (did you mean gate.tau?)"),
        ("gate.zzz=1", "gate.zzz: unknown key"),
    ],
)
def test_an_unknown_key_points_to_the_key_meant(override, hint):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == f"config error: {hint}"


def test_every_preset_of_the_generator_and_their_mixes_are_accepted():
    from alfworld_env import PRESETS

    for preset in [*PRESETS, "tiny+small", "medium+small"]:
        assert load_config(None, [f"env.preset={preset}"]).env.preset == preset


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gate: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize(
    ("text", "match"),
    [("", "the file is empty"), ("# only a comment\n", "the file is empty"), ("- a\n- b\n", "YAML list")],
)
def test_a_yaml_that_is_not_a_mapping_is_refused(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, ["gate.tau=0.07", "seed=3"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_driver_section_s_old_name_is_read_with_one_warning_line(tmp_path, caplog):
    old = tmp_path / "old.yaml"
    old.write_text("train:\n  iterations: 5\n  eval_every: 2\n")
    with caplog.at_level(logging.WARNING, logger="selective_rollout.config"):
        cfg = load_config(old)
    assert (cfg.driver.iterations, cfg.driver.eval_every) == (5, 2)
    (line,) = _warnings(caplog)
    assert line == "config: the 'train' section is deprecated; it is read as 'driver'"
    # a later layer overrides an earlier one whichever name each uses
    assert load_config(old, ["driver.iterations=7"]).driver.iterations == 7
    assert load_config("configs/cpu_default.yaml", ["train.iterations=9"]).driver.iterations == 9
    # an old run's saved config still validates (the experiment runner compares against it)
    assert RunConfig.model_validate({"train": {"iterations": 4}}).driver.iterations == 4


def test_gate_name_none_is_read_with_one_warning_line_and_the_strategy_is_the_switch(caplog):
    with caplog.at_level(logging.WARNING, logger="selective_rollout.config"):
        cfg = load_config(None, ["rollout.strategy=selective", "gate.name=none"])
    assert cfg.gate.name == "none" and cfg.rollout.uses_gate  # runs as before: a gate that never stops
    (line,) = _warnings(caplog)
    assert "gate.name=none is deprecated" in line and "rollout.strategy=none" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="selective_rollout.config"):
        assert not load_config(None, ["rollout.strategy=none"]).rollout.uses_gate
    assert _warnings(caplog) == []


def test_a_later_layer_that_selects_another_gate_replaces_the_earlier_layers_keys():
    paper = ["gate.name=prefix_edit", "gate.k=4", "gate.tau=0.2"]
    with pytest.raises(ConfigError, match="gate 'stalled' has no such parameter"):  # one list: refused
        load_config(None, [*paper, "gate.name=stalled"])
    cfg = load_config(None, paper, layers=[["gate.name=stalled", "gate.k=11"]])
    assert cfg.gate.name == "stalled" and cfg.gate.k == 11
    assert cfg.gate.build().params.max_finished_frac == 0.0
    kept = load_config(None, paper, layers=[["rollout.group_size=4"]])  # no new entry: keys stay
    assert kept.gate.build().params.tau == 0.2


def test_the_trajectory_stop_section_selects_a_rule_with_its_own_keys():
    cfg = load_config(None, ["trajectory_stop.name=outlived", "trajectory_stop.min_step=4"])
    rule = cfg.trajectory_stop.build()
    assert rule.name == "outlived" and (rule.params.min_step, rule.params.min_winners) == (4, 1)
    assert cfg.trajectory_stop.audit_target == 0.95
    default = load_config(None, [])
    assert default.trajectory_stop.name == "none" and not default.trajectory_stop.build().due(10)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trajectory_stop.name=outlived", "trajectory_stop.window=3"],
            "trajectory_stop.window: trajectory stop 'outlived' has no such parameter (looping has) (got 3)",
        ),
        (
            ["trajectory_stop.name=outlive"],
            "trajectory_stop.name: unknown trajectory stop 'outlive' (did you mean 'outlived'?); known: "
            "looping, none, outlived (got 'outlive')",
        ),
        (
            ["trajectory_stop.name=looping", "trajectory_stop.windw=3"],
            "trajectory_stop.windw: unknown key (did you mean trajectory_stop.window?)",
        ),
        (
            ["trajectory_stop.name=outlived", "trajectory_stop.min_winners=0"],
            "trajectory_stop.min_winners must be >= 1 (got 0)",
        ),
        (
            ["trajectory_stop.name=looping", "trajectory_stop.min_step=15"],
            "trajectory_stop.min_step=15 is not below rollout.max_steps=15: the rule would never stop a "
            "trajectory",
        ),
        (["trajectory_stop.audit_target=0"], "trajectory_stop.audit_target must be > 0.0 (got 0)"),
    ],
)
def test_a_bad_trajectory_stop_key_is_one_line_naming_it(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert str(info.value).startswith(f"config error: {message}") and "\n" not in str(info.value)


def test_a_later_layer_that_selects_another_rule_replaces_the_earlier_layers_keys():
    looping = ["trajectory_stop.name=looping", "trajectory_stop.window=4"]
    cfg = load_config(None, looping, layers=[["trajectory_stop.name=outlived"]])
    assert cfg.trajectory_stop.name == "outlived" and "window" not in (cfg.trajectory_stop.model_extra or {})
