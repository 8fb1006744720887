"""The one way a pluggable entry joins the system: gates, rollout strategies, environments, engine
back-ends and the learner's loss components are each a ``Registry`` of entries by name.

An entry is a class named three ways, all loaded the same lazy way:

- a ``"module:Class"`` string (``REGISTRY.add``): the shipped entries, listed in
  ``selective_rollout.plugins``; the module is imported only when the entry is used or its
  parameters are read;
- an entry point of the registry's group in an installed package's metadata (``[project.entry-points.
  "selective_rollout.gates"] my_gate = "my_pkg.gates:MyGate"``): a third party plugs in without
  editing this package;
- its own path as the name (``env.name=my_pkg.envs:MyEnv``): nothing to register, and every process
  that reads the config (Ray workers included) finds the class the same way.

A class decorator (``@REGISTRY.register("name")``) is deprecated: the registration exists only in
the process that ran it, and the Ray actors that resolve names in their own processes (the
coordinator, engines, learners) never see it.

Each entry owns a pydantic ``Params`` model: its parameters with their defaults, bounds and
descriptions, which config validation and the configuration reference read. The model may live in
a module of its own (``params="module:Model"``) when the entry's module is heavy (a back-end
imports torch), so that a config validates without importing what it configures. An entry is
built in one way, ``REGISTRY.build(name, params, **context)``, and an unknown name gets one error
with a "did you mean".
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

T = TypeVar("T")
C = TypeVar("C", bound=type)


def _bounds(info: FieldInfo) -> str:
    """A numeric field's range in words ("in [0.0, 1.0]", ">= 1"), from its Field constraints."""
    ge = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
    le = next((m.le for m in info.metadata if getattr(m, "le", None) is not None), None)
    if ge is not None and le is not None:
        return f"in [{ge}, {le}]"
    return f">= {ge}" if ge is not None else f"<= {le}"


def params_error(kind: str, name: str, model: type[BaseModel], err: ValidationError) -> ValueError:
    """One line naming each bad parameter of entry ``name`` of ``kind`` (a gate, a trajectory stop
    rule), worded for a person building one in code (the run config reports the same errors
    through its own key-naming formatter)."""
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if not e["loc"]:  # a check across parameters (e.g. steps against k), or a model file's
            parts.append(f"{kind} {name!r}: {str(e['msg']).removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            parts.append(f"{kind} {name!r} has no parameter {key!r} (it has: {known})")
        elif e["type"] in ("greater_than_equal", "less_than_equal") and key in model.model_fields:
            parts.append(f"{kind} {key} must be {_bounds(model.model_fields[key])}, got {e['input']!r}")
        else:
            parts.append(f"{kind} {key}: {e['msg']}, got {e['input']!r}")
    return ValueError("; ".join(parts))


M = TypeVar("M", bound=BaseModel)


def bind_params(
    kind: str, name: str, model: type[M], params: BaseModel | None, values: Mapping[str, Any]
) -> M:
    """An entry's parameters as its ``model``: ``params`` itself when already one (what ``build``
    passes), else ``params``' fields or the keyword ``values`` validated by ``model``, a bad one
    raising ``params_error``'s one line. Gates and trajectory stop rules are built both ways: by
    their registry from a config section, and in code with keyword arguments."""
    if params is not None and values:
        raise TypeError(f"{kind} {name!r}: pass its parameters as one model or as keywords, not both")
    if isinstance(params, model):
        return params
    try:
        return model.model_validate(params.model_dump() if params is not None else dict(values))
    except ValidationError as exc:
        raise params_error(kind, name, model, exc) from None


def load(target: str) -> Any:
    """The object a ``"module:attr"`` string names (the module imported now)."""
    if target.count(":") != 1:
        raise ValueError(f"expected 'module:attr', got {target!r}")
    module, attr = target.split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"cannot load {target}: {exc}") from exc


@dataclass
class _Entry:
    target: str | type  # "module:Class" until loaded
    params: str | type[BaseModel] | None = None  # a separate Params model, else the class's own
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = "selective_rollout"  # who registered it, for errors


class Registry(Mapping[str, type], Generic[T]):
    """Entries of one kind by name. ``kind`` words the errors ("unknown gate 'stalld'"); ``group``
    is the entry-point group third parties register under; ``base`` and ``params_base`` (both
    ``"module:Class"``) are what an entry and its ``Params`` must subclass, checked when the entry
    is loaded; ``params_attr`` is the class attribute holding its ``Params`` (None: the entry is
    its own params model, as the learner's loss components are); ``check`` (``"module:func"``,
    ``func(name, cls)``) adds a kind's own refusals (raise TypeError). Everything is named by
    string so that declaring a registry imports nothing of the kind it holds."""

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        base: str,
        params_base: str | None = None,
        params_attr: str | None = "Params",
        check: str | None = None,
    ) -> None:
        self.kind, self.group = kind, group
        self._base, self._params_base = base, params_base
        self._params_attr, self._check = params_attr, check
        self._entries: dict[str, _Entry] = {}
        self._plugins_loaded = False

    # ------------------------------------------------------------------ registering
    def add(self, name: str, target: str, *, params: str | None = None, **meta: Any) -> None:
        """Register the class at ``target`` (``"module:Class"``) under ``name``, lazily; ``params``
        names its ``Params`` model where that lives apart; ``meta`` is what the kind needs to know
        before loading it (a back-end's run-time library, say)."""
        load_check = target.count(":") == 1 and (params is None or params.count(":") == 1)
        if not load_check:
            raise ValueError(f"{self.kind} {name!r}: target must be 'module:Class', got {target!r}")
        self._put(name, _Entry(target, params, meta))

    def register(self, name: str, **meta: Any) -> Callable[[C], C]:
        """Deprecated class decorator registering the class under ``name`` in this process only
        (checked now, as it is loaded); name the class by its path or by an entry point instead."""
        warnings.warn(
            f"{self.kind} {name!r}: registering by decorator is deprecated; the registration exists only "
            f"in this process and Ray actors never see it. Name the class by its path ('module:Class') "
            f"or add an entry point of the group {self.group}",
            DeprecationWarning,
            stacklevel=2,
        )

        def deco(cls: C) -> C:
            self._checked(name, cls, None)
            self._put(name, _Entry(cls, None, meta, source=cls.__module__))
            return cls

        return deco

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a test's entry, once the test is done)."""
        self._entries.pop(name, None)

    def _put(self, name: str, entry: _Entry) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({self._entries[name].source})")
        self._entries[name] = entry

    def _load_plugins(self) -> None:
        """The entry points of ``group`` in installed packages, registered once on first use."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for point in entry_points(group=self.group):
            dist = point.dist.name if point.dist is not None else "an installed package"
            if point.name in self._entries:
                raise ValueError(
                    f"{self.kind} {point.name!r} of {dist} (entry point group {self.group}) clashes "
                    f"with one registered by {self._entries[point.name].source}"
                )
            self._entries[point.name] = _Entry(point.value, None, {}, source=dist)

    # ------------------------------------------------------------------ looking up
    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        if isinstance(name, str) and name not in self._entries and name.count(":") == 1:
            self._entries[name] = _Entry(name, None, {}, source=name)  # a class named by its path
        return name in self._entries

    def __getitem__(self, name: str) -> type:
        if name not in self:
            raise KeyError(name)
        return self.get(name)

    def unknown(self, name: str) -> str:
        """The one error line for a name nobody registered."""
        known = sorted(self)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; known: {', '.join(known)}"

    def _entry(self, name: str) -> _Entry:
        if name not in self:
            raise ValueError(self.unknown(name))
        return self._entries[name]

    def get(self, name: str) -> type:
        """The class registered under ``name``, its module imported now."""
        entry = self._entry(name)
        if isinstance(entry.target, str):
            cls = self._load(name, entry.target)
            self._checked(name, cls, entry.params)
            entry.target = cls
        return entry.target

    def _load(self, name: str, target: str) -> Any:
        try:
            return load(target)
        except ImportError as exc:  # a config error, worded as one: the user named the entry
            raise ValueError(f"{self.kind} {name!r}: {exc}") from None

    def meta(self, name: str) -> dict[str, Any]:
        return dict(self._entry(name).meta)

    def params(self, name: str) -> type[BaseModel]:
        """The entry's ``Params`` model, without importing the entry where it lives apart."""
        entry = self._entry(name)
        if isinstance(entry.params, str):
            entry.params = self._load(name, entry.params)
        if entry.params is not None:
            return entry.params
        cls = self.get(name)
        return cls if self._params_attr is None else getattr(cls, self._params_attr)

    def build(self, name: str, source: object = None, **context: Any) -> T:
        """Entry ``name`` bound to its parameters: ``source`` is a mapping of exactly them (an
        unknown key is refused), an instance of its ``Params``, or an object such as a config
        section that holds them among others (each read by name, missing ones at their default);
        ``context`` is what the kind passes besides (a strategy's seed)."""
        model = self.params(name)
        if isinstance(source, model):
            bound = source
        elif source is None or isinstance(source, Mapping):
            bound = model.model_validate(dict(source or {}))
        else:
            held = {key: getattr(source, key) for key in model.model_fields if hasattr(source, key)}
            bound = model.model_validate(held)
        cls = self.get(name)
        if self._params_attr is None:  # the entry is its own params model
            return cls.model_validate(bound.model_dump())  # type: ignore[no-any-return]
        return cls(bound, **context)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ checks
    def _checked(self, name: str, cls: Any, declared: str | type[BaseModel] | None) -> None:
        base = load(self._base)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{self.kind} {name!r}: {cls!r} is not a {base.__name__} subclass")
        if self._params_base is not None and self._params_attr is not None:
            params_base = load(self._params_base)
            model = declared if isinstance(declared, type) else getattr(cls, self._params_attr)
            if not (isinstance(model, type) and issubclass(model, params_base)):
                raise TypeError(f"{self.kind} {name!r}: Params must subclass {params_base.__name__}")
        if self._check is not None:
            load(self._check)(name, cls)
        if not issubclass(cls, BaseModel):
            cls.name = name
