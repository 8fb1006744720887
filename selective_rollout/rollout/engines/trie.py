"""Constrained choice: a trie over the token ids of the allowed replies.

Each choice is tokenised and closed with the end-of-turn id, so at every decode step the
allowed next tokens are the children of the current node and a finished walk is exactly one
of the choices (``go to cabinet 1`` ends where ``go to cabinet 10`` continues).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ChoiceTrie:
    """Walk state of one constrained sequence; ``allowed()`` lists the next legal token ids."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("ChoiceTrie needs at least one non-empty token sequence")
        self._root: dict[int, dict] = {}
        for seq in sequences:
            node = self._root
            for tok in seq:
                node = node.setdefault(int(tok), {})
        self._node = self._root

    @classmethod
    def of_texts(cls, tokenizer: Any, choices: Sequence[str], eot_id: int) -> ChoiceTrie:
        """The trie of ``choices`` as the engines constrain them: each tokenised without special
        tokens and closed with ``eot_id`` (the learner rebuilds the same trie to score the choice)."""
        ids = tokenizer(list(choices), add_special_tokens=False).input_ids
        return cls([[*seq, eot_id] for seq in ids])

    def allowed_along(self, token_ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The legal next ids before each of ``token_ids``, walked from the root: one set per
        token, up to the first token that leaves the trie (a non-canonical tokenisation of a
        choice, which a string-level grammar such as vLLM's may sample) or the end of a choice."""
        node, sets = self._root, []
        for tok in token_ids:
            if tok not in node:
                break
            sets.append(tuple(node))
            node = node[tok]
        return sets

    def allowed(self) -> list[int]:
        return list(self._node)

    def advance(self, token_id: int) -> None:
        if token_id not in self._node:
            raise ValueError(f"token {token_id} is not allowed here; allowed: {sorted(self._node)[:10]}")
        self._node = self._node[token_id]

    @property
    def done(self) -> bool:
        """True once a whole choice (including its end-of-turn id) has been emitted."""
        return not self._node

    def fork(self) -> ChoiceTrie:
        """A fresh walker over the same trie (one per sampled output of an ``n > 1`` request)."""
        clone = object.__new__(ChoiceTrie)
        clone._root = self._root
        clone._node = self._root
        return clone


class ChoiceTries:
    """The tries of one tokenizer's choice lists, each built once (bounded: cleared past
    ``capacity`` lists). Shared by the engine that constrains replies and the dialogue that scores
    them; callers walk a trie with ``fork()`` or ``allowed_along``, never mutating the shared one."""

    def __init__(self, tokenizer: Any, eot_id: int, capacity: int = 1024) -> None:
        self._tokenizer, self._eot_id, self._capacity = tokenizer, eot_id, capacity
        self._tries: dict[tuple[str, ...], ChoiceTrie] = {}

    def __call__(self, choices: Sequence[str]) -> ChoiceTrie:
        key = tuple(choices)
        trie = self._tries.get(key)
        if trie is None:
            if len(self._tries) >= self._capacity:
                self._tries.clear()
            trie = self._tries[key] = ChoiceTrie.of_texts(self._tokenizer, key, self._eot_id)
        return trie
