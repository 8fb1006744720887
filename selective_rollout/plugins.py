"""What can be plugged in, in one place: every registry and the entries this package ships.

Each line names a class by ``"module:Class"`` and is loaded only when used, so this module (and the
config, which reads parameters through it) imports none of the components it lists. A new gate,
trajectory stop rule, strategy, environment, back-end or loss component of this package is one file
plus one line here; a third party's is one file plus an entry point of the registry's group in its
own package (docs/design.md, "Plugging in").
"""

from __future__ import annotations

from selective_rollout.registry import Registry

_GATE = "selective_rollout.gate"
_TRAJECTORY_STOP = "selective_rollout.trajectory_stop"
_STRATEGIES = "selective_rollout.rollout.strategies"
_ENGINES = "selective_rollout.rollout.engines"
_LOSSES = "selective_rollout.learner.losses"

GATES: Registry = Registry(
    "gate",
    "selective_rollout.gates",
    base=f"{_GATE}.base:Gate",
    params_base=f"{_GATE}.base:GateParams",
    check=f"{_GATE}.base:check_gate",
)
GATES.add("none", f"{_GATE}.base:NoGate")
GATES.add("oracle", f"{_GATE}.base:OracleGate")
GATES.add("prefix_edit", f"{_GATE}.prefix_edit:PrefixEditGate")
GATES.add("two_axis", f"{_GATE}.two_axis:TwoAxisGate")
GATES.add("stalled", f"{_GATE}.stalled:StalledGate")
GATES.add("history", f"{_GATE}.history:HistoryGate")
GATES.add("precision_target", f"{_GATE}.precision_target:PrecisionTargetGate")
GATES.add("learned", f"{_GATE}.learned:LearnedGate")
GATES.add("any", f"{_GATE}.any_of:AnyGate")

TRAJECTORY_STOPS: Registry = Registry(
    "trajectory stop",
    "selective_rollout.trajectory_stops",
    base=f"{_TRAJECTORY_STOP}.base:TrajectoryRule",
    params_base=f"{_TRAJECTORY_STOP}.base:TrajectoryStopParams",
    check=f"{_TRAJECTORY_STOP}.base:check_rule",
)
TRAJECTORY_STOPS.add("none", f"{_TRAJECTORY_STOP}.base:NoStop")
TRAJECTORY_STOPS.add("outlived", f"{_TRAJECTORY_STOP}.outlived:OutlivedRule")
TRAJECTORY_STOPS.add("looping", f"{_TRAJECTORY_STOP}.looping:LoopingRule")

STRATEGIES: Registry = Registry(
    "strategy",
    "selective_rollout.strategies",
    base=f"{_STRATEGIES}:Strategy",
    params_base=f"{_STRATEGIES}:StrategyParams",
)
STRATEGIES.add("none", f"{_STRATEGIES}:NoFilter")
STRATEGIES.add("dapo", f"{_STRATEGIES}:DapoFilter")
STRATEGIES.add("preskip", f"{_STRATEGIES}:PreSkip")
STRATEGIES.add("selective", f"{_STRATEGIES}:Selective")
STRATEGIES.add("selective+dapo", f"{_STRATEGIES}:SelectiveDapo")

# a rollout schedule: how a batch's groups are played (``rollout.mode``), a ``GroupScheduler``
# built with the run's config, engines, env pool and agent (its parameters are rollout.* keys)
ROLLOUT_MODES: Registry = Registry(
    "rollout mode",
    "selective_rollout.rollout_modes",
    base="selective_rollout.rollout.scheduler:GroupScheduler",
    params_attr=None,
)
ROLLOUT_MODES.add("concurrent", "selective_rollout.rollout.coordinator:GroupCoordinator")
ROLLOUT_MODES.add("lockstep", "selective_rollout.rollout.lockstep:LockstepRollout")

ENVS: Registry = Registry(
    "environment",
    "selective_rollout.envs",
    base="selective_rollout.envs.base:Environment",
    params_base="selective_rollout.envs.base:EnvParams",
)
ENVS.add("alfworld", "selective_rollout.envs.alfworld:Alfworld")
ENVS.add("tw-cooking", "selective_rollout.envs.tw_cooking:TwCooking")
ENVS.add("skyrl_gym", "selective_rollout.envs.skyrl:SkyrlGym")
ENVS.add("gymnasium", "selective_rollout.envs.gym_text:GymText")

# ``requires``: the library a back-end imports at run time, checked before Ray starts
BACKENDS: Registry = Registry(
    "back-end",
    "selective_rollout.engines",
    base=f"{_ENGINES}.base:RolloutEngine",
    params_base=f"{_ENGINES}.params:BackendParams",
)
BACKENDS.add(
    "transformers",
    f"{_ENGINES}.transformers_engine:TransformersEngine",
    params=f"{_ENGINES}.params:TransformersParams",
    requires="transformers",
)
BACKENDS.add(
    "vllm", f"{_ENGINES}.vllm_engine:VLLMEngine", params=f"{_ENGINES}.params:VLLMParams", requires="vllm"
)


def _loss_registry(kind: str, group: str, base: str) -> Registry:
    """A registry of one loss component: each entry is its own params model (its fields are its
    parameters), so it is built with ``model_validate``."""
    return Registry(kind, f"selective_rollout.{group}", base=f"{_LOSSES}.{base}", params_attr=None)


_NONE = f"{_LOSSES}.params:NoParams"  # for components whose module imports torch and that own no key
ADVANTAGES = _loss_registry("advantage estimator", "advantages", "advantage:AdvantageEstimator")
ADVANTAGES.add("grpo", f"{_LOSSES}.advantage:GRPO")
ADVANTAGES.add("drgrpo", f"{_LOSSES}.advantage:DrGRPO")
POLICY_LOSSES = _loss_registry("policy loss", "policy_losses", "policy:PolicyLoss")
POLICY_LOSSES.add("ppo_clip", f"{_LOSSES}.policy:PPOClip", params=f"{_LOSSES}.params:PPOClipParams")
POLICY_LOSSES.add(
    "decoupled_ppo", f"{_LOSSES}.policy:DecoupledPPO", params=f"{_LOSSES}.params:DecoupledPPOParams"
)
AGGREGATIONS = _loss_registry("loss aggregation", "loss_aggregations", "aggregation:Aggregation")
AGGREGATIONS.add("token-mean", f"{_LOSSES}.aggregation:TokenMean", params=_NONE)
AGGREGATIONS.add("seq-mean-token-mean", f"{_LOSSES}.aggregation:SeqMeanTokenMean", params=_NONE)
AGGREGATIONS.add("seq-mean-token-sum", f"{_LOSSES}.aggregation:SeqMeanTokenSum", params=_NONE)
KL_ESTIMATORS = _loss_registry("KL estimator", "kl_estimators", "kl:KLEstimator")
KL_ESTIMATORS.add("k1", f"{_LOSSES}.kl:K1", params=_NONE)
KL_ESTIMATORS.add("k3", f"{_LOSSES}.kl:K3", params=_NONE)

# the trainer.* key that selects an entry of each loss registry
LOSS_REGISTRIES: dict[str, Registry] = {
    "policy_loss": POLICY_LOSSES,
    "loss_agg": AGGREGATIONS,
    "kl_estimator": KL_ESTIMATORS,
    "advantage": ADVANTAGES,
}
