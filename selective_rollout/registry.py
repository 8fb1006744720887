"""The one way a pluggable entry joins the system: gates, rollout strategies, environments, engine
back-ends and the learner's loss components are each a ``Registry`` of entries by name.

An entry is a class named three ways, all loaded the same lazy way:

- a ``"module:Class"`` line of the package's catalog (``selective_rollout.plugins``, data that
  imports nothing; each registry reads its own part on first use): the shipped entries, whose
  modules are imported only when the entry is used or its parameters are read;
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
imports torch), so that a config validates without importing what it configures. Each registry
is declared by the contract it holds (``GATES`` beside ``Gate``). Parameters are bound one way,
``bind`` (``REGISTRY.build(name, params, **context)`` uses it), and worded one way when bad,
``describe_errors``; an unknown name gets one error with a "did you mean".
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T")
C = TypeVar("C", bound=type)


_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def describe_errors(
    err: ValidationError,
    *,
    owner: str = "",
    known: Iterable[str] = (),
    hint: Callable[[tuple[Any, ...]], str] | None = None,
) -> str:
    """A validation error as one line, one clause per bad value: the wording of every error a
    person gets for a parameter, whether it came from a run config (keys named ``section.key``,
    ``hint`` suggesting the key meant) or from an entry built in code (``owner`` names it, "gate
    'stalled'", and ``known`` lists its parameters for a key it does not have)."""
    prefix = f"{owner}: " if owner else ""
    parts = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc)
        message = str(e["msg"]).removeprefix("Value error, ")
        bound = next((k for k in _BOUNDS if k in e.get("ctx", {})), None)
        if not loc:  # a check across parameters (steps against k, say)
            parts.append(f"{prefix}{message}")
        elif e["type"] == "extra_forbidden" and owner:
            parts.append(f"{owner} has no parameter {key!r} (it has: {', '.join(known)})")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key{hint(loc) if hint else ''}")
        elif bound is not None:
            parts.append(f"{prefix}{key} must be {_BOUNDS[bound]} {e['ctx'][bound]} (got {e['input']!r})")
        elif isinstance(e.get("input"), Mapping):  # a check over a whole section: its message says it
            parts.append(f"{prefix}{key}: {message}")
        else:
            parts.append(f"{prefix}{key}: {message} (got {e.get('input')!r})")
    return "; ".join(parts)


M = TypeVar("M", bound=BaseModel)


def bind(model: type[M], source: object = None, *, owner: str, **values: Any) -> M:
    """The one way an entry's parameters are bound: ``model`` validated from ``source`` (an
    instance of ``model``, kept as it is; a mapping of exactly its parameters; or an object such
    as a config section holding them among others, each read by name, missing ones at their
    default) or from the keyword ``values``. A bad value raises ``ValueError`` with
    ``describe_errors``' one line naming ``owner``."""
    if source is not None and values:
        raise TypeError(f"{owner}: pass its parameters as one model or as keywords, not both")
    if isinstance(source, model):
        return source
    if source is None or isinstance(source, Mapping):
        data = dict(source or values)
    else:
        data = {key: getattr(source, key) for key in model.model_fields if hasattr(source, key)}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(describe_errors(exc, owner=owner, known=model.model_fields)) from None


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
    ``func(name, cls)``) adds a kind's own refusals (raise TypeError); ``catalog``
    (``"module:NAME"``) is the mapping of shipped entries, name to ``"module:Class"`` or to
    ``{"target": ..., "params": ..., **meta}``. Everything is named by string so that declaring a
    registry imports nothing of the kind it holds."""

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        base: str,
        params_base: str | None = None,
        params_attr: str | None = "Params",
        check: str | None = None,
        catalog: str | None = None,
    ) -> None:
        self.kind, self.group = kind, group
        self._base, self._params_base = base, params_base
        self._params_attr, self._check = params_attr, check
        self._catalog = catalog
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
        """The catalog's lines, then the entry points of ``group`` in installed packages,
        registered once on first use."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        lines: Mapping[str, str | Mapping[str, str]] = load(self._catalog) if self._catalog else {}
        for name, line in lines.items():
            spec = {"target": line} if isinstance(line, str) else dict(line)
            self.add(name, spec.pop("target"), params=spec.pop("params", None), **spec)
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
        """The registered names (a class named by its path is found, not listed)."""
        self._load_plugins()
        return iter(sorted(name for name in self._entries if name.count(":") != 1))

    def __len__(self) -> int:
        return sum(1 for _ in self)

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
        bound = bind(self.params(name), source, owner=f"{self.kind} {name!r}")
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
