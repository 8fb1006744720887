"""Typed run configuration: YAML files in configs/ plus dotted command-line overrides.

OmegaConf reads and merges the YAML and the ``a.b=c`` overrides (its dotlist grammar, not ours);
pydantic validates the merged tree against the schema, so an unknown key or a bad value is
one error line naming the key. Each component owns its section's model in a sibling module.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from logging import getLogger  # by name: the ``logging`` of this package is its section module
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from selective_rollout.config.base import EntrySection
from selective_rollout.config.schema import RunConfig, move_renamed_sections
from selective_rollout.registry import describe_errors

log = getLogger(__name__)


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the offending key."""


def _section_keys(section: str) -> list[str]:
    """The keys a top-level section takes: its model's fields and, for a section of registered
    entries, every entry's own parameters; [] for a name that is no section."""
    info = RunConfig.model_fields.get(section)
    model = info.annotation if info is not None else None
    if not (isinstance(model, type) and hasattr(model, "model_fields")):
        return []
    keys = list(model.model_fields)
    if issubclass(model, EntrySection):
        keys += [
            key
            for selector in model.selectors()
            for entry in model.names(selector)
            for key in model.own_params(entry, selector)
        ]
    return keys


def _did_you_mean(loc: Sequence[Any]) -> str:
    """A hint for an unknown ``section.key``: the section that does declare ``key`` (``driver:`` is
    the driver, ``trainer:`` the learner, and the two are easy to mix up), else a close spelling."""
    if len(loc) != 2:
        return ""
    section, key = str(loc[0]), str(loc[1])
    owners = [name for name in RunConfig.model_fields if name != section and key in _section_keys(name)]
    if owners:
        return f" (did you mean {' or '.join(f'{name}.{key}' for name in owners)}?)"
    close = difflib.get_close_matches(key, _section_keys(section), n=1)
    return f" (did you mean {section}.{close[0]}?)" if close else ""


def _drop_replaced_entry_keys(base: Any, overrides: Any) -> None:
    """An override that selects another entry (``engine.backend=vllm`` over a file with
    ``backend: transformers``, ``gate.name=two_axis``) replaces the file's entry, and with it the
    file's keys of that entry that the new one does not own (``engine.threads``): overrides cannot
    delete keys, so otherwise a profile could never be run on another back-end from the command
    line. Keys given as overrides are still checked against the selected entry."""
    for name, info in RunConfig.model_fields.items():
        section = info.annotation
        if not (isinstance(section, type) and issubclass(section, EntrySection)):
            continue
        old_section, new_section = base.get(name), overrides.get(name)
        if not (OmegaConf.is_dict(old_section) and OmegaConf.is_dict(new_section)):
            continue
        for key in section.selectors():
            default = section.model_fields[key].default
            old, new = old_section.get(key, default), new_section.get(key)
            if new is None or new == old or not section.selectable(old, key):
                continue
            keep = section.own_params(new, key) if section.selectable(new, key) else {}
            for param in set(section.own_params(old, key)) - set(keep):
                old_section.pop(param, None)


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), layers: Sequence[Sequence[str]] = ()
) -> RunConfig:
    """Load ``path`` (YAML), apply ``overrides`` (``section.key=value``), validate.

    ``layers`` are later lists of overrides, each applied over the result of the ones before (an
    experiment's arm over its shared overrides): a layer that selects another entry replaces the
    earlier layers' keys of that entry as an override replaces the file's."""
    base = OmegaConf.create({})
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            raise ConfigError(
                f"{path}: the file is empty; a config maps sections to settings (configs/*.yaml)"
            )
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"{path}: the top level is a YAML {type(loaded).__name__}, not a mapping of sections "
                "(engine:, rollout:, gate:, ...)"
            )
        try:
            base = OmegaConf.load(path)
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    for item in [*overrides, *(i for layer in layers for i in layer)]:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        merged = base
        move_renamed_sections(merged)
        for items in (overrides, *layers):
            given = OmegaConf.from_dotlist(list(items))
            move_renamed_sections(given)
            _drop_replaced_entry_keys(merged, given)
            merged = OmegaConf.merge(merged, given)
        data: Any = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad override or interpolation: {exc}".splitlines()[0]) from exc
    try:
        cfg = RunConfig.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(f"config error: {describe_errors(exc, hint=_did_you_mean)}") from None
    if cfg.driver.pipelined and cfg.trainer.policy_loss == "ppo_clip":
        log.warning(
            "config: driver.pipeline=%s trains tokens sampled by older weights, and "
            "trainer.policy_loss=ppo_clip does not correct for them; trainer.policy_loss=decoupled_ppo "
            "weighs them by the truncated behaviour importance weight",
            cfg.driver.pipeline,
        )
    if cfg.gate.name == "none":
        log.warning(
            "config: gate.name=none is deprecated; the rollout strategy decides "
            "whether a gate is consulted: turn it off with rollout.strategy=none (or dapo, preskip)"
        )
    return cfg


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config so a run folder says exactly what ran."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


__all__ = ["ConfigError", "RunConfig", "dump_config", "load_config"]
