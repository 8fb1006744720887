"""The gate library at run time: the contract (``base``), one file per gate, divergence features,
incremental tracking, the audit rule and the calibration a gate runs on logged groups. The offline
tools over logs (sweep, held-out evaluation, replay, fitting CLI) live in ``analysis.gate_eval``.

Pure Python plus the C ``editdistance`` library; no Ray and no torch, so it can be reused by
any trainer (see selective_rollout/integrations).
"""

from selective_rollout.gate.base import (
    GATES,
    Gate,
    GateDecision,
    GateParams,
    GroupView,
    NoGate,
    OracleGate,
    build_gate,
    features_at,
    gate_class,
    register_gate,
)
from selective_rollout.gate.base import __getattr__ as __getattr__  # GroupView's former name
from selective_rollout.gate.distance import END, levenshtein_c, levenshtein_py, prefix_edit_distance
from selective_rollout.gate.features import divergence_features
from selective_rollout.gate.history import (
    HistoryGate,  # the gates beyond the paper's: importing registers them
)
from selective_rollout.gate.learned import LearnedGate
from selective_rollout.gate.precision_target import PrecisionTargetGate
from selective_rollout.gate.prefix_edit import PrefixEditGate
from selective_rollout.gate.stalled import StalledGate
from selective_rollout.gate.tracker import DivergenceTracker
from selective_rollout.gate.two_axis import TwoAxisGate
from selective_rollout.gate.watch import GateWatch

__all__ = [
    "END",
    "GATES",
    "DivergenceTracker",
    "Gate",
    "GateDecision",
    "GateParams",
    "GateWatch",
    "GroupView",
    "HistoryGate",
    "LearnedGate",
    "NoGate",
    "OracleGate",
    "PrecisionTargetGate",
    "PrefixEditGate",
    "StalledGate",
    "TwoAxisGate",
    "build_gate",
    "divergence_features",
    "features_at",
    "gate_class",
    "levenshtein_c",
    "levenshtein_py",
    "prefix_edit_distance",
    "register_gate",
]
