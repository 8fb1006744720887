"""KL estimators: per-token estimates of KL(pi || ref) from samples of pi (Schulman's k1 and k3).

k1 = log pi - log ref is unbiased but can be negative; k3 = exp(-k1) + k1 - 1 is unbiased,
non-negative and lower-variance, hence the default. Each is an ``@KL_ESTIMATORS.register``
class that ``trainer.kl_estimator`` names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from selective_rollout.trainer.losses.registry import Entry, Registry


class KLEstimator(Entry, ABC):
    """Maps the per-token ``log pi - log ref`` to a per-token KL estimate."""

    @abstractmethod
    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor: ...


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
class K1(KLEstimator):
    """The log-ratio itself."""

    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return log_ratio


@KL_ESTIMATORS.register("k3")
class K3(KLEstimator):
    """``exp(-k1) + k1 - 1``."""

    def __call__(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return torch.exp(-log_ratio) + log_ratio - 1.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate with the named estimator at its default parameters."""
    return KL_ESTIMATORS.get(estimator)()(logprobs - ref_logprobs)
