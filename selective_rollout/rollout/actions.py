"""From a model reply to an admissible command of the game, or an explicit invalid action.

Small models paraphrase (``Go to Cabinet 1.``), wrap the command in prose, or emit garbage.
Matching goes exact, then normalised, then fuzzy (normalised Levenshtein similarity from the C
``editdistance`` library) above a threshold, among commands naming the same object numbers;
anything else is ``INVALID_ACTION``, which the environment answers with "Nothing happens." and
which the coordinator counts. A game without an admissible list takes free text: the reply's
action text is sent as is (the whole reply, or what follows its last ``Action:`` in ReAct), as
skyrl-gym environments expect to parse the response themselves. The parser never raises on any
reply: replies are capped in length before matching so a runaway reply costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import editdistance

INVALID_ACTION = "<invalid action>"  # one token for the gate: every invalid action is the same action
MAX_REPLY_CHARS = 4000
MAX_ACTION_CHARS = 200

MatchKind = Literal["exact", "normalised", "fuzzy", "free", "invalid"]

_ACTION_RE = re.compile(r"action\s*:\s*(.*)", re.IGNORECASE)
_ACTION_MARK = re.compile(r"action\s*:", re.IGNORECASE)
_NON_WORD = re.compile(r"[^a-z0-9]+")
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class ParsedAction:
    command: str  # the admissible command, the free-text action, or INVALID_ACTION
    valid: bool
    match: MatchKind
    extracted: str  # the action text found in the reply, before matching


def normalise(text: str) -> str:
    """Lowercase, punctuation to spaces, whitespace collapsed: ``Go to Cabinet-1.`` -> ``go to cabinet 1``."""
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def extract_action(reply: str, action_format: Literal["react", "action"]) -> str:
    """The action part of a reply: after the last ``Action:`` (react), else its first line."""
    reply = reply[:MAX_REPLY_CHARS]
    found = _ACTION_RE.findall(reply)
    if found:
        text = found[-1]
    elif action_format == "react":
        return ""  # a ReAct reply without an Action line took no action
    else:
        text = reply
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:MAX_ACTION_CHARS] if lines else ""


def free_text_action(reply: str, action_format: Literal["react", "action"]) -> str:
    """The action of a free-text game: the whole reply (action format), or everything after its
    last ``Action:`` (ReAct; none: no action), capped in length."""
    reply = reply[:MAX_REPLY_CHARS]
    if action_format == "action":
        return reply
    marks = list(_ACTION_MARK.finditer(reply))
    return reply[marks[-1].end() :].strip() if marks else ""


def match_action(text: str, admissible: Sequence[str], fuzzy_threshold: float) -> tuple[str, MatchKind]:
    """Map ``text`` to one admissible command; ties in the fuzzy step count as no match."""
    if not text or not admissible:
        return INVALID_ACTION, "invalid"
    if text in admissible:
        return text, "exact"
    norm = normalise(text)
    by_norm = {normalise(c): c for c in admissible}
    if norm in by_norm:
        return by_norm[norm], "normalised"
    if not norm:
        return INVALID_ACTION, "invalid"
    # Object ids are never guessed: a typo in a word is forgiven, ``cabinet`` for ``cabinet 1`` is not.
    numbers = _NUMBER.findall(norm)
    scored = sorted(
        (
            (1.0 - editdistance.eval(norm, n) / max(len(norm), len(n)), c)
            for n, c in by_norm.items()
            if n and _NUMBER.findall(n) == numbers
        ),
        reverse=True,
    )
    if not scored:
        return INVALID_ACTION, "invalid"
    best, command = scored[0]
    runner_up = scored[1][0] if len(scored) > 1 else -1.0
    if best >= fuzzy_threshold and best > runner_up:
        return command, "fuzzy"
    return INVALID_ACTION, "invalid"


def parse_action(
    reply: str,
    admissible: Sequence[str],
    action_format: Literal["react", "action"] = "action",
    fuzzy_threshold: float = 0.85,
) -> ParsedAction:
    """Parse one reply; always returns, whatever the model wrote. With nothing admissible the
    game takes free text: the action is ``free_text_action``'s, valid when not blank."""
    reply = reply if isinstance(reply, str) else ""
    if not admissible:
        text = free_text_action(reply, action_format)
        if not text.strip():  # no action written: the one invalid token, as with a list
            return ParsedAction(INVALID_ACTION, False, "invalid", text)
        return ParsedAction(text, True, "free", text)
    extracted = extract_action(reply, action_format)
    command, kind = match_action(extracted, admissible, fuzzy_threshold)
    return ParsedAction(command, kind != "invalid", kind, extracted)
