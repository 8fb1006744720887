"""The strict base model every config section derives from, and the check of a registered
entry's own keys (a gate's, an environment's) in its section."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

T = TypeVar("T")


class Section(BaseModel):
    """Unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def entry_params(
    section: type[Section],
    data: dict[str, Any],
    registry: Mapping[str, T],
    own: Callable[[T], Mapping[str, Any]],
    validate: Callable[[T, dict[str, Any]], dict[str, Any]],
    kind: str,
) -> dict[str, Any]:
    """``data`` of a section whose selected registry entry (``data["name"]``) owns flat keys:
    refuse a key no entry owns or the selected entry does not own, naming the key, then validate
    the rest with ``validate(entry, keys)`` (the entry's ``Params``), which also fills in its
    defaults, so a dumped config says exactly what ran. An unknown name is left to the name's own
    validator.

    ``own(entry)`` gives an entry's own keys; ``kind`` words the errors ("gate").
    """
    name = data.get("name", section.model_fields["name"].default)
    selected = registry.get(name)
    extra = {key: v for key, v in data.items() if key not in section.model_fields}
    owners = {key: sorted(n for n, e in registry.items() if key in own(e)) for key in extra}
    errors: list[InitErrorDetails] = []
    for key, value in extra.items():
        if not owners[key]:
            errors.append({"type": "extra_forbidden", "loc": (key,), "input": value})
        elif selected is not None and key not in own(selected):
            message = f"{kind} {name!r} has no such parameter ({', '.join(owners[key])} has)"
            error = PydanticCustomError(f"foreign_{kind}_key", message)
            errors.append({"type": error, "loc": (key,), "input": value})
    if errors:
        raise ValidationError.from_exception_data(section.__name__, errors)
    if selected is None:
        return data
    return {**data, **validate(selected, extra)}
