"""How the transformers engine picks each output's tokens from the model's logits.

Temperature and top-p sampling as an exponential race keyed by token id, constrained choice
through the choice trie, jump-forward over the tokens a choice forces, and the log-probs of every
token (the model's own, untempered and unconstrained). The sampler never runs the model: it is
handed the logits of the positions a forward just fed.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from selective_rollout.rollout.engines.transformers_request import Request, Seq
from selective_rollout.rollout.engines.trie import ChoiceTrie, ChoiceTries


def exponential_race(
    probs: torch.Tensor, allowed: torch.Tensor | None, vocab: int, generator: torch.Generator
) -> int:
    """Sample an index of ``probs`` as argmax(p / E) with one Exp(1) draw per *vocabulary* token
    (``probs[i]`` is token ``allowed[i]``, or token i without a constraint).

    Why not ``torch.multinomial`` over the allowed tokens: it races the same way, but its draws
    are indexed by position in the allowed list, which changes with the admissible commands. Drawn
    per token id, a sequence's k-th sampled token sees the same noise for "go" whatever the list
    holds, as vLLM's sampler does (one draw per vocabulary entry from the request's generator).
    Two evaluations of a task that share the step seeds (before and after training) then keep
    picking alike wherever the two policies nearly agree, also after their episodes part, so their
    paired difference carries less sampling noise; each draw is still an exact sample."""
    noise = torch.empty(vocab).exponential_(1.0, generator=generator)
    race = noise if allowed is None else noise.index_select(0, allowed)
    return int((probs / race).argmax())


class Sampler:
    """Token choice for every output: seeds each output's generator, forks the choice trie per
    output, samples, takes forced runs, scores fed tokens and decides when an output ends."""

    def __init__(self, tokenizer: Any, eot_id: int, seed: int) -> None:
        self.eot_id = eot_id
        self._tokenizer = tokenizer
        self._tries = ChoiceTries(tokenizer, eot_id)
        self._seed_source = itertools.count(seed * 1_000_003)
        self.version = 0  # the policy version of the loaded weights, taken by every output admitted
        self.stats = {
            "generated_tokens": 0,
            "forced_tokens": 0,  # of those, taken without sampling (a constrained choice's only legal token)
        }

    def trie(self, choices: list[str]) -> ChoiceTrie:
        """A fresh walk over the trie of ``choices`` (the trie itself is built once per list)."""
        return self._tries(choices).fork()

    def outputs(self, req: Request) -> list[Seq]:
        """The request's ``n`` outputs, each with its own generator (the request's seed plus its
        index, so outputs differ and repeat with the seed) and its own walk of the choice trie."""
        sp = req.sampling
        return [
            Seq(req, i, self._generator(sp.seed, i), req.trie.fork() if req.trie else None, self.version)
            for i in range(sp.n)
        ]

    def advance(self, seq: Seq, logits: torch.Tensor) -> None:
        """Take the logits at the ``len(logits)`` tokens a decode forward just fed ``seq`` (its
        ``fed`` already counts them): each position scores the forced token after it, except the
        position of ``seq``'s last token, which samples the next one; an output left with only
        its unfed last token scored has decided and ends."""
        chunk = logits.shape[0]
        for j in range(chunk - 1 if seq.fed == len(seq.tokens) else chunk):
            # position j predicts token fed - chunk + j + 1: a forced one
            token = seq.tokens[seq.fed - chunk + j + 1]
            seq.scored(float(logits[j, token] - logits[j].logsumexp(-1)))
        if seq.fed == len(seq.tokens):
            self.sample(seq, logits[chunk - 1])
        elif seq.fed == len(seq.tokens) - 1:  # every token scored: a decided output ends here
            seq.finish_reason = seq.decided()

    def sample(self, seq: Seq, logits: torch.Tensor) -> None:
        """Sample one token for ``seq``; record the model's own (untempered) log-prob of it."""
        sp = seq.req.sampling
        logprobs = F.log_softmax(logits, dim=-1)
        allowed = torch.tensor(seq.trie.allowed()) if seq.trie is not None else None
        scores = logits if allowed is None else logits.index_select(0, allowed)
        if sp.temperature == 0:
            pick = int(scores.argmax())
        else:
            probs = F.softmax(scores / sp.temperature, dim=-1)
            if sp.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < sp.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            pick = exponential_race(probs, allowed, logits.numel(), seq.generator)
        token = pick if allowed is None else int(allowed[pick])
        self._emit(seq, token)
        seq.scored(float(logprobs[token]))
        if seq.trie is None:
            if self._stops(seq, token):
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= sp.max_tokens:
                seq.finish_reason = "length"
            return
        self._force(seq)
        if len(seq.logprobs) == len(seq.tokens):  # else the forward that scores the forced run ends it
            seq.finish_reason = seq.decided()

    def _stops(self, seq: Seq, token: int) -> bool:
        """Whether the newly sampled ``token`` ends an unconstrained output: end-of-turn, a stop
        token, or the completion of a stop string. For the strings only the tail that can hold
        one is decoded (every token spans at least one character, bar special and partial-byte
        ones, hence the margin); an occurrence that ended earlier would have ended the output
        then, so finding one in the tail means the newest token completed it."""
        sp = seq.req.sampling
        if token == self.eot_id or (sp.stop_token_ids and token in sp.stop_token_ids):
            return True
        if not sp.stop:
            return False
        tail = seq.tokens[-(max(map(len, sp.stop)) + 2) :]
        text = self._tokenizer.decode(tail, skip_special_tokens=True)
        return any(s in text for s in sp.stop)

    def _force(self, seq: Seq) -> None:
        """Take the tokens a constrained choice leaves no alternative to (jump-forward decoding:
        in ALFWorld commands about three tokens in four are forced, ``go`` -> `` to``). Sampling
        from one legal token always picks it, so the outputs are those of token-by-token decoding;
        only their log-probs come later, from the forward that feeds them."""
        limit = seq.req.sampling.max_tokens
        while not seq.trie.done and len(seq.tokens) < limit:
            allowed = seq.trie.allowed()
            if len(allowed) != 1:
                return
            self._emit(seq, allowed[0])
            self.stats["forced_tokens"] += 1

    def _emit(self, seq: Seq, token: int) -> None:
        seq.tokens.append(token)
        self.stats["generated_tokens"] += 1
        if seq.trie is not None:
            seq.trie.advance(token)

    def _generator(self, seed: int | None, index: int) -> torch.Generator:
        gen = torch.Generator()
        gen.manual_seed(seed + index if seed is not None else next(self._seed_source))
        return gen
