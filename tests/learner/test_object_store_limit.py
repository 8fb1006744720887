"""Weight sync through Ray's object store is refused for models too big to copy that way."""

from __future__ import annotations

import math

import pytest


@pytest.mark.ray
def test_object_store_sync_of_a_big_model_is_refused_with_its_size(ray_cluster, tiny_model_dir, monkeypatch):
    """object_store copies the whole model through Ray's object store per engine and sync: above
    ``OBJECT_STORE_MAX_PARAMS`` (1B; lowered here to below the tiny model's size) the first sync
    stops the run with one line naming the model's size and the process-group alternatives."""
    from selective_rollout.config.trainer import TrainerConfig
    from selective_rollout.learner import LearnerGroup

    group = LearnerGroup(TrainerConfig(weight_sync="object_store"), tiny_model_dir)
    try:
        params = sum(math.prod(spec.shape) for spec in group._on_rank0("weight_specs"))
        assert LearnerGroup.OBJECT_STORE_MAX_PARAMS == 1_000_000_000 > params
        assert group.sync_method() == "object_store"  # a small model may use it
        monkeypatch.setattr(LearnerGroup, "OBJECT_STORE_MAX_PARAMS", params - 1)
        with pytest.raises(ValueError) as raised:
            group.sync_weights([object()], 1)  # refused before any engine is touched
        message = str(raised.value)
        assert "\n" not in message, message
        assert f"trainer.weight_sync=object_store with a model of {params:,} parameters" in message
        assert "use trainer.weight_sync=nccl (GPUs) or gloo" in message
    finally:
        group.shutdown()
