"""The registry's shared parameter binding: what gates and trajectory stop rules build from."""

import pytest
from pydantic import BaseModel, ConfigDict, Field

from selective_rollout.registry import bind_params


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(4, ge=1)
    tau: float = Field(0.1, ge=0.0, le=1.0)


class Other(BaseModel):
    k: int = 7


def test_a_model_of_its_own_kind_is_kept_as_it_is():
    given = Knobs(k=9)
    assert bind_params("gate", "demo", Knobs, given, {}) is given


def test_keyword_values_and_another_model_are_validated_into_the_entrys_model():
    assert bind_params("gate", "demo", Knobs, None, {"tau": 0.5}) == Knobs(k=4, tau=0.5)
    assert bind_params("gate", "demo", Knobs, Other(), {}) == Knobs(k=7)


def test_bad_values_get_one_line_naming_the_entry_and_each_parameter():
    with pytest.raises(ValueError) as err:
        bind_params("trajectory stop", "demo", Knobs, None, {"k": 0, "tua": 0.2})
    text = str(err.value)
    assert "\n" not in text
    assert "trajectory stop k must be >= 1, got 0" in text
    assert "trajectory stop 'demo' has no parameter 'tua' (it has: k, tau)" in text


def test_a_model_and_keywords_together_are_refused_not_half_ignored():
    with pytest.raises(TypeError, match="one model or as keywords, not both"):
        bind_params("gate", "demo", Knobs, Knobs(), {"k": 3})


def test_registering_by_decorator_warns_that_ray_actors_never_see_it():
    from selective_rollout.plugins import STRATEGIES
    from selective_rollout.rollout.strategies import NoFilter

    with pytest.warns(DeprecationWarning, match="exists only in this process and Ray actors never see it"):
        deco = STRATEGIES.register("toy_no_filter")
    try:
        deco(type("ToyNoFilter", (NoFilter,), {}))
        assert "toy_no_filter" in STRATEGIES  # still works here, for one release
    finally:
        STRATEGIES.remove("toy_no_filter")
    assert "selective_rollout.rollout.strategies:NoFilter" in STRATEGIES  # the path: every process
