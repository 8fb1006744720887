"""Process-wide caches for the two costs that dominate ALFWorld's text engine.

- Parse cache: textworld re-parses (TatSu) the same grammar templates and conjunctive queries
  on every step, once per admissible command. Parsing is a pure function of the text, so the
  parsed symbols are kept and a fresh deep copy is handed out (callers mutate their context).
- Translation cache: every load and every reset runs Fast Downward's PDDL->SAS translator on
  the same problem text. Its result is only read afterwards, so G copies of one game (and their
  resets) share one translation.

Both are switched on by ``enable()`` in env workers and can be switched off to measure them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import lru_cache

import fast_downward
import textworld.envs.pddl.textgen as textgen
import textworld.logic as twlogic

_ORIGINAL: dict[str, Callable] = {
    "textgen": textgen._parse_and_convert,
    "logic": twlogic._parse_and_convert,
    "pddl2sas": fast_downward.pddl2sas,
}


def _copying_cache(fn: Callable, maxsize: int) -> Callable:
    cached = lru_cache(maxsize=maxsize)(lambda args, kwargs: fn(*args, **dict(kwargs)))

    def wrapper(*args, **kwargs):
        return copy.deepcopy(cached(args, tuple(sorted(kwargs.items()))))

    wrapper.cache_info = cached.cache_info  # type: ignore[attr-defined]
    return wrapper


def _shared_cache(fn: Callable, maxsize: int) -> Callable:
    cached = lru_cache(maxsize=maxsize)(lambda args, kwargs: fn(*args, **dict(kwargs)))

    def wrapper(*args, **kwargs):
        return cached(args, tuple(sorted(kwargs.items())))

    wrapper.cache_info = cached.cache_info  # type: ignore[attr-defined]
    return wrapper


def enable(parse_cache: bool = True, translation_cache: bool = True, max_games: int = 64) -> None:
    """Install the caches in this process (idempotent); ``False`` restores textworld's originals."""
    disable()
    if parse_cache:
        textgen._parse_and_convert = _copying_cache(_ORIGINAL["textgen"], 4096)
        twlogic._parse_and_convert = _copying_cache(_ORIGINAL["logic"], 4096)
    if translation_cache:
        fast_downward.pddl2sas = _shared_cache(_ORIGINAL["pddl2sas"], 2 * max_games)


def disable() -> None:
    textgen._parse_and_convert = _ORIGINAL["textgen"]
    twlogic._parse_and_convert = _ORIGINAL["logic"]
    fast_downward.pddl2sas = _ORIGINAL["pddl2sas"]
