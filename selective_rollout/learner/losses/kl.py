"""KL estimators: per-token estimates of KL(pi || ref) from samples of pi (Schulman's k1 and k3).

k1 = log pi - log ref is unbiased but can be negative; k3 = exp(-k1) + k1 - 1 is unbiased,
non-negative and lower-variance, hence the default. Each is a class listed in
``KL_ESTIMATORS`` (``selective_rollout.learner.losses``) that ``trainer.kl_estimator`` names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from selective_rollout.learner.losses import KL_ESTIMATORS
from selective_rollout.learner.losses.params import Entry


class KLEstimator(Entry, ABC):
    """Maps the per-token ``log pi - log ref`` to a per-token KL estimate."""

    @abstractmethod
    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor: ...


class K1(KLEstimator):
    """The log-ratio itself."""

    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return log_ratio


class K3(KLEstimator):
    """``exp(-k1) + k1 - 1``."""

    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return torch.exp(-log_ratio) + log_ratio - 1.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate with the named estimator at its default parameters."""
    return KL_ESTIMATORS.build(estimator)(logprobs - ref_logprobs)
