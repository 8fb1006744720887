"""Shipped configs load, and docs/configuration.md is exactly what the schema generates."""

from pathlib import Path

import pytest

from selective_rollout.config import load_config
from selective_rollout.config.reference import render

ROOT = Path(__file__).resolve().parents[2]


RUN_CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
EXPERIMENTS = sorted((ROOT / "configs" / "experiments").glob("*.yaml"))


def test_run_profiles_and_experiment_files_live_in_their_own_folders():
    assert RUN_CONFIGS and EXPERIMENTS
    assert not [p.name for p in RUN_CONFIGS if "arms:" in p.read_text()]
    assert all("arms:" in p.read_text() for p in EXPERIMENTS)


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_shipped_config_is_valid(path):
    cfg = load_config(path)
    assert cfg.rollout.group_size >= 2
    if cfg.rollout.strategy.startswith("selective"):
        assert cfg.gate.k <= cfg.rollout.max_steps


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_arm_of_a_shipped_experiment_is_a_valid_run(path):
    from selective_rollout.analysis.experiment import load_experiment

    exp, base = load_experiment(path)
    for arm in exp.arms.values():
        load_config(base, layers=[*exp.layers(), arm])


def test_paper_recipe_matches_the_paper():
    cfg = load_config(ROOT / "configs" / "alfworld_qwen2.5_7b_grpo.yaml")
    assert (cfg.rollout.group_size, cfg.gate.k, cfg.gate.tau, cfg.rollout.max_steps) == (8, 10, 0.12, 30)
    assert cfg.trainer.lora.enabled and cfg.trainer.lora.rank == 16
    assert cfg.rollout.groups_per_iteration == 10 and cfg.env.source == "official"


def test_the_async_recipe_is_the_paper_recipe_pipelined_on_a_split_chosen_for_it():
    sync = load_config(ROOT / "configs" / "alfworld_qwen2.5_7b_grpo.yaml")
    pipelined = load_config(ROOT / "configs" / "alfworld_qwen2.5_7b_grpo_async.yaml")
    assert sync.driver.pipeline == "sync" and sync.trainer.policy_loss == "ppo_clip"
    assert (pipelined.driver.pipeline, pipelined.driver.max_staleness) == ("async", 1)
    assert pipelined.trainer.policy_loss == "decoupled_ppo"
    # one node's 8 GPUs, more of them rolling out
    assert (sync.engine.num_engines, sync.trainer.num_learners) == (4, 4)
    assert (pipelined.engine.num_engines, pipelined.trainer.num_learners) == (6, 2)
    # the method unchanged
    changed = {"name", "engine", "trainer", "driver"}
    same = sync.model_dump(exclude=changed) == pipelined.model_dump(exclude=changed)
    assert same and sync.gate == pipelined.gate and sync.rollout == pipelined.rollout


def test_cpu_profile_is_in_the_methods_regime_by_construction():
    """DESIGN.md 4: G = 8, episodes of >= 15 steps, the regime's D_K read mid-trajectory (K 3-6 and
    <= 40% of the cap) even though the profile's gate (stalled) decides later; the measured half of
    the regime (zero-variance share, D_K spread) is bench/regime.py's."""
    cfg = load_config(ROOT / "configs" / "cpu_default.yaml")
    rc, gate = cfg.rollout, cfg.gate
    assert rc.group_size == 8 and rc.max_steps >= 15
    assert 3 <= cfg.regime_k <= 6 and cfg.regime_k <= 0.4 * rc.max_steps
    assert (gate.name, gate.k) == ("stalled", 11) and rc.strategy == "selective"
    assert cfg.agent.admissible_in_prompt == "first_turn" and cfg.agent.constrain_to_admissible
    assert cfg.agent.history_turns >= rc.max_steps  # one segment per trajectory
    assert 0 < rc.audit_budget <= 0.05 and cfg.warm_start.enabled


def test_regime_k_defaults_to_the_gates_and_stays_within_the_episode():
    assert load_config(None, ["gate.k=5"]).regime_k == 5
    assert load_config(None, ["gate.k=11", "logging.regime_k=4"]).regime_k == 4
    # the CPU profile's regime step (4) on 3-step episodes: read at the last step, not refused
    short = load_config(ROOT / "configs" / "cpu_default.yaml", ["rollout.max_steps=3", "gate.k=2"])
    assert short.regime_k == 3


def test_configuration_reference_is_current():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    fix = "python -m selective_rollout.config.reference > docs/configuration.md"
    assert doc == render(), f"the reference is stale; regenerate it: {fix}"


def test_nccl_sync_with_a_shared_gpu_is_refused():
    from selective_rollout.config import ConfigError

    shared = ["trainer.weight_sync=nccl", "placement.learner_num_gpus=0.5", "engine.num_gpus=0.5"]
    with pytest.raises(ConfigError, match="NCCL refuses"):
        load_config(None, shared)
    load_config(None, ["trainer.weight_sync=nccl", "placement.learner_num_gpus=1", "engine.num_gpus=1"])


def test_two_node_recipe_is_the_multinode_recipe_on_16_gpus():
    """2 nodes x 8 GPUs: half the multinode recipe's engines, learners, prompts and env workers, so
    each engine and learner carries the same load; everything else is the same run."""
    from selective_rollout.placement import resource_demand

    two = load_config(ROOT / "configs" / "alfworld_qwen2.5_7b_2node.yaml")
    four = load_config(ROOT / "configs" / "alfworld_qwen2.5_7b_multinode.yaml")
    assert resource_demand(two)["GPU"] == 16 and resource_demand(four)["GPU"] == 32
    assert (two.engine.num_engines, two.trainer.num_learners) == (8, 8)
    assert two.engine.num_gpus == two.engine.tensor_parallel_size == 1
    halved = {
        "engine": {"num_engines": 8},
        "trainer": {"num_learners": 8},
        "rollout": {"groups_per_iteration": 16, "max_groups_in_flight": 32},
        "env": {"num_workers": 32},
    }
    same = four.model_dump()
    for section, keys in halved.items():
        same[section].update(keys)
    same["name"] = two.name
    assert two.model_dump() == same


def _rescores(cfg) -> bool | None:
    return (cfg.engine.model_extra or {}).get("rescore_choices")


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_no_shipped_config_reprefills_whole_dialogues_for_log_probs_nothing_trains_on(path):
    """Re-scoring a constrained reply is an uncached prefill of the whole dialogue, every turn
    (on vLLM: 4-5x fewer env steps/s); only trainer.old_logprobs: engine and the behaviour weights
    of an async run's decoupled_ppo train on its result."""
    cfg = load_config(path)
    if _rescores(cfg) is not None:
        behaviour = cfg.driver.pipeline == "async" and cfg.trainer.policy_loss == "decoupled_ppo"
        assert _rescores(cfg) == (cfg.trainer.old_logprobs == "engine" or behaviour)


def test_rescoring_follows_the_objective_unless_set():
    recipe = ROOT / "configs" / "alfworld_qwen2.5_7b_grpo.yaml"
    assert _rescores(load_config(recipe)) is False
    assert _rescores(load_config(recipe, ["trainer.old_logprobs=engine"])) is True
    assert _rescores(load_config(recipe, ["engine.rescore_choices=true"])) is True
    pipelined = ["driver.pipeline=async", "trainer.policy_loss=decoupled_ppo"]
    assert _rescores(load_config(recipe, pipelined)) is True  # the stale tokens' behaviour log-probs
    assert _rescores(load_config(recipe, ["driver.pipeline=async"])) is False  # ppo_clip: unused
    assert (
        _rescores(load_config(recipe, ["trainer.old_logprobs=engine", "engine.rescore_choices=false"]))
        is False
    )
