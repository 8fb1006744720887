"""The strict base model every config section derives from, and the base of the sections that
select a registered entry (a gate, a rollout strategy, an engine back-end) whose parameters are
flat keys of the section."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from selective_rollout.registry import Registry, bind, load

P = TypeVar("P", bound=BaseModel)


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class EntrySection(Section):
    """A section whose selector keys each name an entry of a registry (``GATES``, ``BACKENDS``,
    the learner's four loss registries), each entry declaring its own parameters in a ``Params``
    model (with defaults, bounds and descriptions).

    The selected entries' own parameters are flat keys of the section (``gate.tau``,
    ``rollout.preskip_window``, ``engine.threads``, ``trainer.clip_high``), so a new entry needs no
    change to the config: an unregistered name, a key another entry owns (the line says who owns
    it) and a key nobody owns are each one error naming the key, and the selected entries' missing
    keys take their defaults (a dumped config says exactly what ran). A ``Params`` field that is
    also a key of the section is shared: the entry reads the section's value and does not own it.

    A subclass with one selector sets ``selector`` and ``registry_at``, the registry's
    ``"module:NAME"``, loaded on first use: the config imports none of the packages whose entries
    it validates (they import the config), and reads only ``Params`` models, which a registry
    loads without importing the entries that live in heavy modules. One with several selectors
    overrides ``selectors``.
    """

    # the selected entries' own parameters are extra keys, checked by _own_params below
    model_config = ConfigDict(extra="allow")

    selector: ClassVar[str]
    registry_at: ClassVar[str]

    @classmethod
    def selectors(cls) -> dict[str, Registry]:
        """Each selector key and the registry whose entry it names."""
        return {cls.selector: load(cls.registry_at)}

    @classmethod
    def _key(cls, key: str | None) -> str:
        return cls.selector if key is None else key

    @classmethod
    def selectable(cls, name: str, key: str | None = None) -> bool:
        """Whether a run may select entry ``name`` with selector ``key`` (registered, by default)."""
        return name in cls.selectors()[cls._key(key)]

    @classmethod
    def names(cls, key: str | None = None) -> list[str]:
        """The entries selector ``key`` may select."""
        return [name for name in cls.selectors()[cls._key(key)] if cls.selectable(name, key)]

    @classmethod
    def unknown(cls, name: str, key: str | None = None) -> str:
        """The error for a name selector ``key`` cannot select."""
        return cls.selectors()[cls._key(key)].unknown(name)

    @classmethod
    def own_params(cls, name: str, key: str | None = None) -> dict[str, FieldInfo]:
        """Entry ``name``'s own parameters (its ``Params`` fields that are not the section's)."""
        fields = cls.selectors()[cls._key(key)].params(name).model_fields
        return {field: info for field, info in fields.items() if field not in cls.model_fields}

    @classmethod
    def selected(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Each selector key's value in ``data``, or its default."""
        return {key: data.get(key, cls.model_fields[key].default) for key in cls.selectors()}

    @model_validator(mode="before")
    @classmethod
    def _own_params(cls, data: Any) -> Any:
        """Refuse an unselectable name, a key no entry owns or no selected entry owns; validate
        the rest with each selected entry's ``Params`` and fill in its defaults. Other entries'
        parameters are read only to name a misplaced key's owner."""
        if not isinstance(data, dict):
            return data
        chosen = {key: name for key, name in cls.selected(data).items() if isinstance(name, str)}
        extra = {key: value for key, value in data.items() if key not in cls.model_fields}
        errors: list[InitErrorDetails] = []
        owned: dict[str, dict[str, FieldInfo]] = {}  # selector key -> its entry's own parameters
        for key, name in chosen.items():
            try:
                problem = None if cls.selectable(name, key) else cls.unknown(name, key)
                if problem is None:
                    owned[key] = cls.own_params(name, key)
            except ValueError as exc:  # an entry that cannot be loaded (a path to nothing, say)
                problem = str(exc)
            if problem is not None:
                error = PydanticCustomError("unknown_entry", problem)
                errors.append({"type": error, "loc": (key,), "input": name})
        for field, value in extra.items():
            if any(field in own for own in owned.values()):
                continue
            error = cls._misplaced(field, value, chosen, owned)
            if error is not None:
                errors.append(error)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        out = dict(data)
        for key, own in owned.items():
            model = cls.selectors()[key].params(chosen[key])
            shared = {field: value for field, value in data.items() if field in cls.model_fields}
            given = {field: value for field, value in extra.items() if field in own}
            mine = {field: value for field, value in shared.items() if field in model.model_fields}
            params = model.model_validate({**mine, **given})
            # the entry's own keys, and the shared ones it declares as its Params settled them (a
            # composed gate derives its k from its members)
            declared = set(own) | (set(params.model_fields) & set(cls.model_fields))
            out.update(params.model_dump(include=declared))
        return out

    @classmethod
    def _misplaced(
        cls, field: str, value: Any, chosen: dict[str, str], owned: dict[str, dict[str, FieldInfo]]
    ) -> InitErrorDetails | None:
        """The error for a key no selected entry owns: who does own it, if anyone (None where its
        owner's selector names no usable entry, which has its own error)."""
        for key, registry in cls.selectors().items():
            owners = [n for n in cls.names(key) if n != chosen.get(key) and field in cls.own_params(n, key)]
            if owners and key not in owned:
                return None
            if owners:
                message = f"{registry.kind} {chosen[key]!r} has no such parameter ({', '.join(owners)} has)"
                return {"type": PydanticCustomError("foreign_key", message), "loc": (field,), "input": value}
        return {"type": "extra_forbidden", "loc": (field,), "input": value}

    def params_for(self, model: type[P]) -> P:
        """``model`` (a selected entry's ``Params``) bound to this section's values: its own keys
        and the shared ones it declares."""
        return bind(model, self, owner=type(self).__name__)

    def build(self, **context: Any) -> Any:
        """The selected entry bound to this section (``registry.build``); ``context`` is what the
        kind passes besides its parameters."""
        return self.selectors()[self.selector].build(getattr(self, self.selector), self, **context)
