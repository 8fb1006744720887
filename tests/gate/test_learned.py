"""The learned gate: fit CLI, model file, loading errors, decisions that follow the features."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.gate_eval.fit import main
from selective_rollout.analysis.gate_eval.replay import replay, summarize
from selective_rollout.config import ConfigError, load_config
from selective_rollout.gate import GroupView, build_gate
from selective_rollout.gate.learned import FEATURES, LearnedModel, fit_model
from selective_rollout.records import GroupWriter
from selective_rollout.stats import task_folds
from tests.gate.synthetic import converged, divergent, mixed_log, partly


def _separable(n: int = 12) -> list:
    """Converged groups are zero-variance, divergent ones mixed, except a few of each."""
    groups = []
    for i in range(n):
        groups.append(converged(f"z{i}", [float(i % 2)] * 4))
        groups.append(divergent(f"m{i}", [1, 0, 1, 0]))
    groups.append(partly("pz", [0] * 4, shared=2))
    groups.append(partly("pm", [1, 0, 0, 0], shared=3))
    return groups


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "gate.json"
    fit_model(_separable(), k=3, target=0.9).save(path)
    return path


def test_fit_learns_that_converged_groups_are_zero_variance(model_file) -> None:
    model = LearnedModel.load(model_file)
    assert model.features == list(FEATURES) and model.k == 3 and model.steps == []
    assert model.info["reached_target"] and model.info["fit_precision"] >= 0.9
    gate = build_gate("learned", k=3, model_path=str(model_file))
    same = gate.decide(GroupView([["a", "b", "c"]] * 4, step=3))
    apart = gate.decide(GroupView([[f"{i}a", f"{i}b", f"{i}c"] for i in range(4)], step=3))
    assert same.stop and not apart.stop
    assert same.features["p_zero_variance"] > 0.9 > apart.features["p_zero_variance"]
    # the threshold is a parameter: above every probability the gate never stops
    assert (
        not build_gate("learned", k=3, model_path=str(model_file), p_stop=1.0)
        .decide(GroupView([["a", "b", "c"]] * 4, step=3))
        .stop
    )


def test_decisions_follow_the_weights(model_file, tmp_path) -> None:
    """A model whose D_K weight is flipped decides the other way: the gate reads its file."""
    data = json.loads(model_file.read_text())
    data["weights"] = [-w for w in data["weights"]]
    data["bias"] = -data["bias"]
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps(data))
    gate = build_gate("learned", k=3, model_path=str(flipped))
    assert not gate.decide(GroupView([["a", "b", "c"]] * 4, step=3)).stop


def test_model_file_errors_are_one_clear_line(model_file, tmp_path) -> None:
    with pytest.raises(ValueError, match="needs model_path"):
        build_gate("learned", k=3)
    with pytest.raises(ValueError, match=r"model file not found: .*nope\.json"):
        build_gate("learned", k=3, model_path=str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match=r"fit at k=3 steps=\[\].*set gate\.k=3"):
        build_gate("learned", k=4, model_path=str(model_file))
    with pytest.raises(ValueError, match="fit at k=3"):
        build_gate("learned", k=3, steps=[5], model_path=str(model_file))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"weights": [1]}))
    with pytest.raises(ValueError, match="not a learned gate model"):
        build_gate("learned", k=3, model_path=str(other))
    bad = json.loads(model_file.read_text())
    bad["features"] = ["prefix_edit_distance", "magic"]
    bad["mean"], bad["scale"], bad["weights"] = [0, 0], [1, 1], [1, 1]
    other.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"unknown features \['magic'\]"):
        build_gate("learned", k=3, model_path=str(other))


def test_run_config_selects_and_checks_the_learned_gate(model_file, tmp_path) -> None:
    cfg = load_config(None, ["gate.name=learned", "gate.k=3", f"gate.model_path={model_file}"])
    assert cfg.gate.build().model.k == 3
    with pytest.raises(ConfigError, match="fit at k=3"):
        load_config(None, ["gate.name=learned", "gate.k=5", f"gate.model_path={model_file}"])
    with pytest.raises(ConfigError, match="model file not found"):
        load_config(None, ["gate.name=learned", "gate.k=3", f"gate.model_path={tmp_path / 'x.json'}"])


def test_fit_refuses_one_class_and_empty_data() -> None:
    with pytest.raises(ValueError, match="every one of the 3 groups to fit is zero-variance"):
        fit_model([converged(f"t{i}", [0] * 4) for i in range(3)], k=3)
    with pytest.raises(ValueError, match="still running after step 30"):
        fit_model(_separable(), k=30)


def test_threshold_is_chosen_out_of_fold_for_the_target() -> None:
    log = mixed_log(seed=1, tasks=40)
    model = fit_model(log, k=4, steps=[6, 8], target=0.8, cv_folds=4)
    assert model.info["threshold_on"].startswith("out-of-fold") and model.steps == [6, 8]
    # the fit-data precision at the chosen threshold (out of fold) meets the target
    assert model.info["fit_precision"] >= 0.8 or not model.info["reached_target"]


def test_task_folds_keep_a_tasks_groups_together() -> None:
    tasks = ["a", "b", "a", "c", "b", "d", "a"]
    folds = task_folds(tasks, 2, seed=3)
    for t in set(tasks):
        assert len({f for f, u in zip(folds, tasks, strict=True) if u == t}) == 1
    assert set(folds) == {0, 1}


def test_fit_cli_writes_a_model_the_gate_runs(tmp_path, capsys) -> None:
    log = tmp_path / "rollouts.jsonl"
    with GroupWriter(log) as w:
        for g in _separable():
            w.write(g)
    out = tmp_path / "m" / "gate.json"
    assert main(["--rollouts", str(log), "--k", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gate.name=learned" in printed and "prefix_edit_distance" in printed
    gate = build_gate("learned", k=3, model_path=str(out))
    s = summarize(replay(gate, _separable()))
    assert s["precision"] >= 0.9 and s["recall"] > 0.5
    assert main(["--rollouts", str(tmp_path / "none.jsonl"), "--k", "3", "--out", str(out)]) == 2
    assert "not found" in capsys.readouterr().err


def test_stratified_folds_share_out_both_kinds() -> None:
    tasks = [f"t{i}" for i in range(12)]
    labels = [i < 4 for i in range(12)]  # 4 zero-variance tasks of 12
    for seed in range(5):
        folds = task_folds(tasks, 2, seed, labels)
        assert sum(f == 0 and y for f, y in zip(folds, labels, strict=True)) == 2
