"""The policy model: loading (full fine-tuning or LoRA), token log-probs, and weights in engine names.

Engines hold a plain HF ``AutoModelForCausalLM``, so whatever the learner trains is exported
under that model's ``named_parameters()`` names: LoRA adapters are folded into copies of the
base weights on the fly (the learner's own weights are left untouched), one module at a time
(``export_units``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from peft.tuners.lora import Embedding as LoraEmbedding
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, PreTrainedModel

from selective_rollout.config.trainer import TrainerConfig


def load_policy(model_path: str | Path, cfg: TrainerConfig) -> torch.nn.Module:
    """The trainable policy in the training precision, LoRA-wrapped if enabled.

    Loaded straight in bf16 when training in bf16 (DeepSpeed keeps its fp32 master copy itself), so
    a 7B policy or KL reference never holds a transient fp32 copy (28 GB) on its way to the GPU.
    """
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model folder {path} has no config.json (expected a HF save_pretrained folder)"
        )
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if not cfg.lora.enabled:
        return model
    lora = PeftLoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    if cfg.gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, lora)


# positions x rows per chunk of the log-prob computation: bounds its fp32 temporaries to
# CHUNK_TOKENS x vocabulary (~0.8 GB at Qwen's 152k vocabulary) whatever the micro-batch holds
CHUNK_TOKENS = 1024


class TokenLogprobs(NamedTuple):
    """Per predicted token (``[B, T-1]``): the model's log-prob of it; the entropy of the model's
    next-token distribution (no grad; when asked); and, when choice sets were given, the log of
    the probability mass the model puts on the tokens the choice allowed (0 where none was), so
    that ``logprobs - allowed_mass`` is the log-prob under the constrained choice."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    allowed_mass: torch.Tensor | None = None


def _chosen_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, choices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) of one chunk, in fp32 (fp64 stays): gather minus log-sum-exp, no full softmax;
    and the log-mass of each position's ``choices`` (ids padded with -1; no id: 0)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, targets[..., None]).squeeze(-1) - total
    if choices is None:
        return chosen, None
    listed = choices >= 0
    # a finite floor, not -inf: a position with no choice then has a finite log-sum-exp (and a
    # zero, not NaN, gradient once torch.where discards it)
    picked = logits.gather(-1, choices.clamp(min=0)).masked_fill(~listed, torch.finfo(logits.dtype).min)
    mass = torch.where(listed.any(-1), torch.logsumexp(picked, dim=-1) - total, 0.0)
    return chosen, mass


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    with_entropy: bool = False,
    chunk_tokens: int = CHUNK_TOKENS,
    positions: torch.Tensor | None = None,
    choice_ids: torch.Tensor | None = None,
) -> TokenLogprobs:
    """Log-prob of each next token, ``[B, T-1]``, and optionally the policy's entropy there (no grad)
    and the log-mass of the tokens a constrained choice allowed (``choice_ids``, ``[B, T-1, C]``
    padded with -1, as ``MicroBatch.choice_ids``).

    ``positions`` (``[B, T-1]``, e.g. a loss mask) names the positions the caller reads: the
    vocabulary projection then runs only on the columns where some row needs it (the model's
    ``logits_to_keep``), and every other position reads 0. In a multi-turn dialogue the policy's
    own tokens are ~10% of the sequence, and the projection onto SmolLM2's 49k vocabulary is ~20%
    of a forward and backward, so the learner skips most of it.

    The fp32 log-softmax of a whole micro-batch over the vocabulary is the learner's largest
    temporary (16k tokens x 152k vocabulary: ~10 GB, and as much again kept for the backward), so
    it runs chunk by chunk along the sequence, each chunk recomputed in the backward
    (activation checkpointing) instead of kept; the result equals the unchunked computation.
    """
    columns = None if positions is None else positions.any(0).nonzero().squeeze(1)
    if columns is None or len(columns) == 0:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
        targets = input_ids[:, 1:]
    else:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=columns
        ).logits
        targets = input_ids[:, columns + 1]
        choice_ids = None if choice_ids is None else choice_ids[:, columns]
    out = _chunked_logprobs(logits, targets, choice_ids, with_entropy, chunk_tokens)
    if columns is None or len(columns) == 0:
        return out
    shape = (input_ids.shape[0], input_ids.shape[1] - 1)
    return TokenLogprobs(*(None if t is None else _at_columns(t, columns, shape) for t in out))


def _at_columns(values: torch.Tensor, columns: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``values`` (``[B, len(columns)]``) placed at ``columns`` of a zero ``[B, T-1]`` tensor
    (differentiable)."""
    return values.new_zeros(shape).index_copy(1, columns, values)


def _chunked_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    choice_ids: torch.Tensor | None,
    with_entropy: bool,
    chunk_tokens: int,
) -> TokenLogprobs:
    step = max(1, chunk_tokens // max(1, logits.shape[0]))
    spans = [(s, min(s + step, logits.shape[1])) for s in range(0, logits.shape[1], step)]
    checkpointed = torch.is_grad_enabled() and logits.requires_grad and len(spans) > 1
    parts = [
        (logits[:, a:b], targets[:, a:b], None if choice_ids is None else choice_ids[:, a:b])
        for a, b in spans
    ]
    chunks = [
        checkpoint(_chosen_logprobs, *part, use_reentrant=False) if checkpointed else _chosen_logprobs(*part)
        for part in parts
    ]
    chosen = torch.cat([c for c, _ in chunks], dim=1)
    mass = None if choice_ids is None else torch.cat([m for _, m in chunks], dim=1)
    if not with_entropy:
        return TokenLogprobs(chosen, None, mass)
    with torch.no_grad():
        entropy = torch.cat([_entropy(logits[:, a:b]) for a, b in spans], dim=1)
    return TokenLogprobs(chosen, entropy, mass)


def hf_model(model: torch.nn.Module) -> PreTrainedModel:
    """The HF model under a peft wrapper (with LoRA layers injected), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@dataclass
class ExportUnit:
    """One module's share of the exported weights: what to gather for it and what it exports.

    ``params`` is everything the export reads: a module's own parameters, or a LoRA layer's
    base weight and bias together with its adapters (the merge needs all of them whole at once).
    ``exports`` are ``(engine name, parameter)``; ``lora`` is the layer whose active adapters'
    deltas are added to a copy of its base weight (its bias is exported as it is).
    """

    params: list[torch.nn.Parameter]
    exports: list[tuple[str, torch.nn.Parameter]]
    lora: LoraLayer | None = None
    merged: torch.nn.Parameter | None = None  # the LoRA layer's base weight

    def weights(self) -> list[tuple[str, torch.Tensor]]:
        """``(engine name, tensor)`` of this unit; its ``params`` must be whole (gathered)."""
        out = []
        with torch.no_grad():
            for name, param in self.exports:
                tensor = param.detach()
                if self.lora is not None and param is self.merged:
                    tensor = _merged(tensor, self.lora)
                out.append((name, tensor))
        return out


def _merged(weight: torch.Tensor, layer: LoraLayer) -> torch.Tensor:
    """``weight`` plus every active adapter's delta, summed in fp32 and rounded to the weight's
    dtype once. PEFT's own delta is rounded to the adapter's dtype before it is added, and the
    sum in bf16 rounds again: two roundings where one will do, on every device."""
    total = weight.to(torch.float32, copy=True)  # a copy even in fp32: the learner's weight stays
    for adapter in layer.active_adapters:
        total += _delta_fp32(layer, adapter)
    return total.to(weight.dtype)


def _delta_fp32(layer: LoraLayer, adapter: str) -> torch.Tensor:
    """One adapter's ``scaling * B @ A`` in fp32, laid out as the base weight (PEFT's formula for
    linear and embedding layers); other layer kinds take PEFT's delta, rounded once already."""
    if isinstance(layer, LoraLinear):
        a, b, transposed = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight, layer.fan_in_fan_out
    elif isinstance(layer, LoraEmbedding):
        a, b, transposed = layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter], True
    else:
        return layer.get_delta_weight(adapter).float()
    delta = b.float() @ a.float()
    return (delta.T if transposed else delta) * layer.scaling[adapter]


def export_units(model: torch.nn.Module) -> list[ExportUnit]:
    """The exported weights one module at a time, in ``named_parameters()`` order: a LoRA layer
    (its base layer and adapters) is one unit, any other module's own parameters another.

    Exporting unit by unit bounds what must be whole at once to the largest module (under
    ZeRO-3 that is what gets gathered), never the whole model; a tied weight is exported once,
    by the module that ``named_parameters()`` lists it under."""
    base = hf_model(model)
    lora_modules = {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}
    units: dict[str, ExportUnit] = {}
    for name, param in base.named_parameters():
        owner = name.rpartition(".")[0]
        parts = owner.split(".") if owner else []
        layer_name = next(
            (p for p in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if p in lora_modules), None
        )
        if layer_name is None:
            unit = units.setdefault(owner, ExportUnit([], []))
            unit.params.append(param)
            if not any(part.startswith("lora_") for part in parts):
                unit.exports.append((name, param))
            continue
        unit = units.setdefault(layer_name, ExportUnit([], [], lora_modules[layer_name]))
        unit.params.append(param)
        rest = name[len(layer_name) + 1 :]
        if rest.startswith("base_layer."):
            unit.exports.append((f"{layer_name}.{rest.removeprefix('base_layer.')}", param))
            if rest == "base_layer.weight":
                unit.merged = param
    return list(units.values())


def merged_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` in the engine's names; LoRA deltas added to copies of their base weights
    (the whole model at once: for a model that is whole, e.g. the warm start's)."""
    return [named for unit in export_units(model) for named in unit.weights()]


def checksum(named: Iterable[tuple[str, torch.Tensor]], dtype: str | None = None) -> float:
    """Sum of float64 sums: equal weights give an equal number on learner and engine.

    ``dtype`` (e.g. ``"bfloat16"``) rounds each weight to an engine's precision first, so a learner
    in fp32 can be compared with an engine that holds the weights it received in bf16.
    """
    cast = getattr(torch, dtype) if dtype else None
    return float(
        sum((t.detach().to(cast) if cast else t.detach()).to(torch.float64).sum().item() for _, t in named)
    )
