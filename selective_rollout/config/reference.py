"""Generate docs/configuration.md from the schema, so the reference can never drift from the code.

    python -m selective_rollout.config.reference > docs/configuration.md

A test compares the committed file with this output.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from selective_rollout.config.base import EntrySection
from selective_rollout.config.schema import RunConfig

INTRO = """# Configuration reference

Generated from the schema (`selective_rollout/config/`) by
`python -m selective_rollout.config.reference`; do not edit by hand.

A run is a YAML file (see `configs/`) plus dotted command-line overrides, e.g.
`python -m selective_rollout.train --config configs/cpu_default.yaml gate.k=10 rollout.group_size=8`.
Unknown keys and invalid values are rejected with one error line naming the key.

Shipped configs: `cpu_default.yaml` (the laptop profile `make train` runs),
`alfworld_qwen2.5_7b_grpo.yaml` (the paper's setup on one 8-GPU node),
`alfworld_qwen2.5_7b_grpo_async.yaml` (the same pipelined, on 6 engines + 2 learners),
`alfworld_qwen2.5_7b_multinode.yaml` (the same on 4 nodes x 8 GPUs), `alfworld_qwen2.5_7b_2node.yaml`
(on 2 nodes x 8 GPUs), `cpu_textworld.yaml` (the CPU profile on TextWorld Cooking, the second
environment). `configs/experiments/` holds experiment files (arms x seeds over a run profile,
docs/experiments.md), not run configs.
"""
TABLE_HEAD = "| key | type | default | constraint | meaning |"
TABLE_RULE = "|---|---|---|---|---|"


def _type_name(info: FieldInfo) -> str:
    text = str(info.annotation).replace("typing.", "")
    return text.removeprefix("<class '").removesuffix("'>")


def _default(info: FieldInfo) -> str:
    value: Any = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str)


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "len >=")):
            if getattr(meta, name, None) is not None:
                parts.append(f"{sym} {getattr(meta, name)}")
    return ", ".join(parts)


def _row(key: str, info: FieldInfo) -> str:
    desc = (info.description or "").replace("|", "\\|")
    cells = [f"`{key}`", f"`{_type_name(info)}`", f"`{_default(info)}`", _constraints(info), desc]
    return "| " + " | ".join(cells) + " |"


def _entry_rows(heading: str, doc: str | None, fields: dict[str, FieldInfo], prefix: str) -> list[str]:
    """One registered entry (a gate, a strategy, a back-end, a loss): its heading, first doc
    paragraph and own parameters."""
    out = [f"### `{heading}`", "", inspect.cleandoc(doc or "").split("\n\n")[0].replace("\n", " "), ""]
    if not fields:
        return out + ["No parameters of its own.", ""]
    rows = [_row(f"{prefix}{key}", info) for key, info in fields.items()]
    return [*out, TABLE_HEAD, TABLE_RULE, *rows, ""]


def _selected_entry_rows(section: type[EntrySection], prefix: str) -> list[str]:
    """Each entry a section can select (gates, strategies, engine back-ends, loss components) with
    its own parameters, read from its ``Params`` model (flat keys of the section, accepted only
    with that entry selected); its description is its class's docstring. The registries above
    config are read when this runs, as validation does."""
    out = []
    for key, registry in section.selectors().items():
        for name in section.names(key):
            doc, fields = registry.get(name).__doc__, section.own_params(name, key)
            out += _entry_rows(f"{prefix}{key}: {name}", doc, fields, prefix)
    return out


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows, sections = [], []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sections.append((f"{prefix}{name}", annotation))
            continue
        rows.append(_row(f"{prefix}{name}", info))
    out = []
    if rows:
        title = prefix.rstrip(".") or "top level"
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"## `{title}`", "", doc, "", TABLE_HEAD, TABLE_RULE]
        out += rows + [""]
    if issubclass(model, EntrySection):
        out += _selected_entry_rows(model, prefix)
    for section_prefix, section in sections:
        out += _rows(section, section_prefix + ".")
    return out


def render() -> str:
    return INTRO + "\n" + "\n".join(_rows(RunConfig, "")) + "\n"


if __name__ == "__main__":
    print(render(), end="")
