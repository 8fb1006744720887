"""What this package ships that can be plugged in, in one place: the catalog of every registry.

Data only: each line maps an entry's name to its class as ``"module:Class"`` (or to a mapping
with that ``target``, a ``params`` model kept apart from a heavy module, and what the kind needs to
know before loading it). Each registry is declared by the contract it holds (``GATES`` in
``selective_rollout.gate.base``, say) and reads its part of this catalog on first use, so this
module imports nothing and nothing is loaded before it is used. A new gate, trajectory stop rule,
strategy, rollout schedule, environment, back-end or loss component of this package is one file
plus one line here; a third party's is one file plus an entry point of the registry's group in its
own package (docs/design.md, "Plugging in").
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import Any

_GATE = "selective_rollout.gate"
_TRAJECTORY_STOP = "selective_rollout.trajectory_stop"
_STRATEGIES = "selective_rollout.rollout.strategies"
_ENGINES = "selective_rollout.rollout.engines"
_LOSSES = "selective_rollout.learner.losses"
_NONE = f"{_LOSSES}.params:NoParams"  # for components whose module imports torch and that own no key

GATE_CATALOG = {
    "none": f"{_GATE}.base:NoGate",
    "oracle": f"{_GATE}.base:OracleGate",
    "prefix_edit": f"{_GATE}.prefix_edit:PrefixEditGate",
    "two_axis": f"{_GATE}.two_axis:TwoAxisGate",
    "stalled": f"{_GATE}.stalled:StalledGate",
    "history": f"{_GATE}.history:HistoryGate",
    "precision_target": f"{_GATE}.precision_target:PrecisionTargetGate",
    "learned": f"{_GATE}.learned:LearnedGate",
    "any": f"{_GATE}.any_of:AnyGate",
}

TRAJECTORY_STOP_CATALOG = {
    "none": f"{_TRAJECTORY_STOP}.base:NoStop",
    "outlived": f"{_TRAJECTORY_STOP}.outlived:OutlivedRule",
    "looping": f"{_TRAJECTORY_STOP}.looping:LoopingRule",
}

STRATEGY_CATALOG = {
    "none": f"{_STRATEGIES}:NoFilter",
    "dapo": f"{_STRATEGIES}:DapoFilter",
    "preskip": f"{_STRATEGIES}:PreSkip",
    "selective": f"{_STRATEGIES}:Selective",
    "selective+dapo": f"{_STRATEGIES}:SelectiveDapo",
}

ROLLOUT_MODE_CATALOG = {
    "concurrent": "selective_rollout.rollout.coordinator:GroupCoordinator",
    "lockstep": "selective_rollout.rollout.lockstep:LockstepRollout",
}

ENV_CATALOG = {
    "alfworld": "selective_rollout.envs.alfworld:Alfworld",
    "tw-cooking": "selective_rollout.envs.tw_cooking:TwCooking",
    "skyrl_gym": "selective_rollout.envs.skyrl:SkyrlGym",
    "gymnasium": "selective_rollout.envs.gym_text:GymText",
}

# ``requires``: the library a back-end imports at run time, checked before Ray starts
BACKEND_CATALOG = {
    "transformers": {
        "target": f"{_ENGINES}.transformers_engine:TransformersEngine",
        "params": f"{_ENGINES}.params:TransformersParams",
        "requires": "transformers",
    },
    "vllm": {
        "target": f"{_ENGINES}.vllm_engine:VLLMEngine",
        "params": f"{_ENGINES}.params:VLLMParams",
        "requires": "vllm",
    },
    "openai": {
        "target": f"{_ENGINES}.openai_engine:OpenAIEngine",
        "params": f"{_ENGINES}.params:OpenAIParams",
    },
}

ADVANTAGE_CATALOG = {"grpo": f"{_LOSSES}.advantage:GRPO", "drgrpo": f"{_LOSSES}.advantage:DrGRPO"}
POLICY_LOSS_CATALOG = {
    "ppo_clip": {"target": f"{_LOSSES}.policy:PPOClip", "params": f"{_LOSSES}.params:PPOClipParams"},
    "decoupled_ppo": {
        "target": f"{_LOSSES}.policy:DecoupledPPO",
        "params": f"{_LOSSES}.params:DecoupledPPOParams",
    },
}
AGGREGATION_CATALOG = {
    name: {"target": f"{_LOSSES}.aggregation:{cls}", "params": _NONE}
    for name, cls in [
        ("token-mean", "TokenMean"),
        ("seq-mean-token-mean", "SeqMeanTokenMean"),
        ("seq-mean-token-sum", "SeqMeanTokenSum"),
    ]
}
KL_ESTIMATOR_CATALOG = {
    "k1": {"target": f"{_LOSSES}.kl:K1", "params": _NONE},
    "k3": {"target": f"{_LOSSES}.kl:K3", "params": _NONE},
}

# the registries' former home: ``from selective_rollout.plugins import GATES`` keeps working for one
# release, with a DeprecationWarning naming where each registry lives now
_MOVED = {
    "GATES": f"{_GATE}.base",
    "TRAJECTORY_STOPS": f"{_TRAJECTORY_STOP}.base",
    "STRATEGIES": _STRATEGIES,
    "ROLLOUT_MODES": "selective_rollout.rollout.source",
    "ENVS": "selective_rollout.envs.base",
    "BACKENDS": f"{_ENGINES}.base",
    "ADVANTAGES": _LOSSES,
    "POLICY_LOSSES": _LOSSES,
    "AGGREGATIONS": _LOSSES,
    "KL_ESTIMATORS": _LOSSES,
    "LOSS_REGISTRIES": _LOSSES,
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"selective_rollout.plugins.{name} is deprecated: the registry lives in {_MOVED[name]}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(import_module(_MOVED[name]), name)
