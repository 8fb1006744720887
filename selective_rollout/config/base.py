"""The strict base model every config section derives from, and the base of the sections that
select a registered entry (a gate, a rollout strategy, an engine back-end) whose parameters are
flat keys of the section."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from selective_rollout.registry import Registry

P = TypeVar("P", bound=BaseModel)


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class EntrySection(Section):
    """A section whose ``selector`` key names an entry of a registry (``selective_rollout.plugins``),
    each entry declaring its own parameters in a ``Params`` model (with defaults, bounds and
    descriptions).

    The selected entry's own parameters are flat keys of the section (``gate.tau``,
    ``rollout.preskip_window``, ``engine.threads``), so a new entry needs no change to the config:
    an unregistered name, a key another entry owns (the line says who owns it) and a key nobody
    owns are each one error naming the key, and the selected entry's missing keys take its
    defaults (a dumped config says exactly what ran). A ``Params`` field that is also a key of the
    section is shared: the entry reads the section's value and does not own it.

    A subclass sets ``selector`` and ``registry``. Only ``Params`` models are read here, which the
    registry loads without importing the entries that live in heavy modules.
    """

    # the selected entry's own parameters are extra keys, checked by _own_params below
    model_config = ConfigDict(extra="allow")

    selector: ClassVar[str]
    registry: ClassVar[Registry]

    @classmethod
    def selectable(cls, name: str) -> bool:
        """Whether a run may select entry ``name`` (registered, by default)."""
        return name in cls.registry

    @classmethod
    def names(cls) -> list[str]:
        """The entries this section may select."""
        return [name for name in cls.registry if cls.selectable(name)]

    @classmethod
    def unknown(cls, name: str) -> str:
        """The error for a name the section cannot select."""
        return cls.registry.unknown(name)

    @classmethod
    def own_params(cls, name: str) -> dict[str, FieldInfo]:
        """Entry ``name``'s own parameters (its ``Params`` fields that are not the section's)."""
        fields = cls.registry.params(name).model_fields
        return {key: info for key, info in fields.items() if key not in cls.model_fields}

    @model_validator(mode="before")
    @classmethod
    def _own_params(cls, data: Any) -> Any:
        """Refuse an unselectable name, a key no entry owns or the selected entry does not own;
        validate the rest with the selected entry's ``Params`` and fill in its defaults. Other
        entries' parameters are read only to name a misplaced key's owner."""
        if not isinstance(data, dict):
            return data
        selected = data.get(cls.selector, cls.model_fields[cls.selector].default)
        if not isinstance(selected, str):  # the selector's own type check says so
            return data
        extra = {key: value for key, value in data.items() if key not in cls.model_fields}
        errors: list[InitErrorDetails] = []
        try:
            own = cls.own_params(selected) if cls.selectable(selected) else None
            problem = None if own is not None else cls.unknown(selected)
        except ValueError as exc:  # an entry that cannot be loaded (a path to nothing, say)
            own, problem = None, str(exc)
        if problem is not None:
            error = PydanticCustomError("unknown_entry", problem)
            errors.append({"type": error, "loc": (cls.selector,), "input": selected})
        for key, value in extra.items():
            if own is not None and key in own:
                continue
            owners = [name for name in cls.names() if name != selected and key in cls.own_params(name)]
            if not owners:
                errors.append({"type": "extra_forbidden", "loc": (key,), "input": value})
            elif own is not None:
                message = f"{cls.registry.kind} {selected!r} has no such parameter ({', '.join(owners)} has)"
                error = PydanticCustomError("foreign_key", message)
                errors.append({"type": error, "loc": (key,), "input": value})
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        params = cls.registry.params(selected).model_validate({**cls._shared(data), **extra})
        # the entry's own keys, and the shared ones it declares as its Params settled them (a
        # composed gate derives its k from its members)
        declared = set(own or ()) | (set(params.model_fields) & set(cls.model_fields))
        return {**data, **params.model_dump(include=declared)}

    @classmethod
    def _shared(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The section's own keys given in ``data`` that the selected entry's ``Params`` declares
        too (validated together, so a check across both, steps against k, holds at load)."""
        selected = data.get(cls.selector, cls.model_fields[cls.selector].default)
        fields = cls.registry.params(selected).model_fields
        return {key: value for key, value in data.items() if key in cls.model_fields and key in fields}

    def params_for(self, model: type[P]) -> P:
        """``model`` (the selected entry's ``Params``) bound to this section's values: its own keys
        and the shared ones it declares."""
        return model.model_validate({key: getattr(self, key) for key in model.model_fields})

    def build(self, **context: Any) -> Any:
        """The selected entry bound to this section (``registry.build``); ``context`` is what the
        kind passes besides its parameters."""
        return self.registry.build(getattr(self, self.selector), self, **context)
