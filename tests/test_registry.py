"""The registry's shared parameter binding: what gates and trajectory stop rules build from."""

import pytest
from pydantic import BaseModel, ConfigDict, Field

from selective_rollout.registry import bind


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(4, ge=1)
    tau: float = Field(0.1, ge=0.0, le=1.0)


class Other(BaseModel):
    k: int = 7


def test_a_model_of_its_own_kind_is_kept_as_it_is():
    given = Knobs(k=9)
    assert bind(Knobs, given, owner="gate 'demo'") is given


def test_keywords_a_mapping_and_another_object_are_validated_into_the_entrys_model():
    assert bind(Knobs, owner="gate 'demo'", tau=0.5) == Knobs(k=4, tau=0.5)
    assert bind(Knobs, {"tau": 0.5}, owner="gate 'demo'") == Knobs(k=4, tau=0.5)
    assert bind(Knobs, Other(), owner="gate 'demo'") == Knobs(k=7)  # read by name, as a config section


def test_bad_values_get_one_line_naming_the_entry_and_each_parameter():
    with pytest.raises(ValueError) as err:
        bind(Knobs, {"k": 0, "tua": 0.2}, owner="trajectory stop 'demo'")
    text = str(err.value)
    assert "\n" not in text
    assert "trajectory stop 'demo': k must be >= 1 (got 0)" in text
    assert "trajectory stop 'demo' has no parameter 'tua' (it has: k, tau)" in text


def test_a_model_and_keywords_together_are_refused_not_half_ignored():
    with pytest.raises(TypeError, match="one model or as keywords, not both"):
        bind(Knobs, Knobs(), owner="gate 'demo'", k=3)


def test_a_config_and_an_entry_built_in_code_word_a_bad_value_alike():
    """One formatter: the run config names the key by its section, code by the entry."""
    from selective_rollout.config import ConfigError, load_config
    from selective_rollout.gate import build_gate

    with pytest.raises(ConfigError, match=r"gate\.k must be >= 1 \(got 0\)"):
        load_config(None, ["gate.k=0"])
    with pytest.raises(ValueError, match=r"gate 'prefix_edit': k must be >= 1 \(got 0\)"):
        build_gate("prefix_edit", k=0)


def test_the_catalog_is_data_and_every_registry_reads_its_own_part():
    import ast
    from pathlib import Path

    import selective_rollout.plugins as catalog
    from selective_rollout.gate.base import GATES

    tree = ast.parse(Path(catalog.__file__).read_text())
    ours = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("selective")
    ]
    assert ours == []  # names every entry by string, imports none
    assert set(catalog.GATE_CATALOG) <= set(GATES)
    with pytest.warns(DeprecationWarning, match="the registry lives in selective_rollout.gate.base"):
        assert catalog.GATES is GATES


def test_registering_by_decorator_warns_that_ray_actors_never_see_it():
    from selective_rollout.rollout.strategies import STRATEGIES, NoFilter

    with pytest.warns(DeprecationWarning, match="exists only in this process and Ray actors never see it"):
        deco = STRATEGIES.register("toy_no_filter")
    try:
        deco(type("ToyNoFilter", (NoFilter,), {}))
        assert "toy_no_filter" in STRATEGIES  # still works here, for one release
    finally:
        STRATEGIES.remove("toy_no_filter")
    assert "selective_rollout.rollout.strategies:NoFilter" in STRATEGIES  # the path: every process
