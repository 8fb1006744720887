"""Methods vLLM mixes into each of its GPU/CPU workers (``worker_extension_cls``).

vLLM runs the model in worker processes that the engine actor never touches directly; the
actor reaches them with ``collective_rpc(<method name>)``. Names carry an ``sr_`` prefix so
they cannot shadow a worker's own methods. vLLM's loaders take HF parameter names and do the
fusing (qkv, gate/up) themselves, which is why the learner sends HF names. Loading goes through
the worker's ``reload_weights``: on CPU, vLLM packs linear weights into oneDNN handles and frees
the originals, so only its layer-wise reload (which re-runs the post-load processing) can replace
them. A load that stops midway (a called-off sync) closes that reload before it leaves
(``_sr_close_reload``), so the retry starts clean, and tied layers, which the reload does not
process, are processed after it (``_sr_process_tied``). Arguments cross vLLM's msgpack RPC, which turns
tensors into lists and refuses dataclasses, so they travel as plain tuples and raw bytes
(``pack_specs`` / ``pack_tensors``).

No RPC method raises across that boundary: each replies ``(True, value)`` or ``(False, reason)``
(``replies``). vLLM's multiproc executor reads one reply per worker, in rank order, and raises at
the first failed one, leaving the later ranks' replies queued; the next call on that engine reads
them as its own, so with tensor parallelism one called-off sync (every rank fails it) left every
later call a reply behind. Replying instead, every rank's answer is read by the call it belongs to.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from selective_rollout.weight_sync.collective import SyncAborted, TensorSpec, broadcast, make_sync_group

log = logging.getLogger(__name__)


def replies(method: Callable[..., Any]) -> Callable[..., tuple[bool, Any]]:
    """``method`` as an RPC that answers ``(True, its value)``, or ``(False, why it failed)``
    after logging the error here (vLLM logs a raised one in the worker the same way)."""

    @functools.wraps(method)
    def rpc(self, *args: Any) -> tuple[bool, Any]:
        try:
            return True, method(self, *args)
        except Exception as exc:
            log.exception("weight-sync RPC %s failed on this worker", method.__name__)
            return False, f"{type(exc).__name__}: {exc}"

    return rpc


def pack_specs(specs: list[TensorSpec]) -> list[tuple[str, list[int], str]]:
    return [(s.name, list(s.shape), s.dtype) for s in specs]


def pack_tensors(named: dict[str, torch.Tensor]) -> list[tuple[str, list[int], str, bytes]]:
    return [
        (
            name,
            list(t.shape),
            TensorSpec.of(name, t).dtype,
            t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes(),
        )
        for name, t in named.items()
    ]


def _unpack_tensor(shape: list[int], dtype: str, data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)


class WeightSyncExtension:
    """Joins the learner's sync group and loads broadcast or by-value weights into the model."""

    @replies
    def sr_init_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        # Tensor-parallel workers of one engine take consecutive ranks after ``first_rank``.
        rank = first_rank + int(getattr(self, "rank", 0))
        self._sr_group = make_sync_group(backend, host, port, rank, world_size)

    @replies
    def sr_receive_weights(self, packed_specs: list[tuple[str, list[int], str]]) -> None:
        """Receive each tensor when the loader asks for it: at most about one tensor of extra device
        memory, not a second copy of the model (~15 GB for a 7B model in bf16).

        A sync that stops here (called off, or this worker's own load failed) leaves the model
        partly loaded until the next sync, and the group unusable. A worker whose own load fails
        calls the sync off itself: every other member waits on its part of the transfer."""
        group = getattr(self, "_sr_group", None)
        if group is None:
            raise RuntimeError("receive_weights called before init_weight_sync (or after a failed sync)")
        stream = self._sr_stream(group, packed_specs)
        try:
            self._sr_load(stream)
            for _ in stream:  # what the loader did not ask for must still be received: rank 0 waits on it
                pass
        except Exception as exc:
            self._sr_group = None
            if not isinstance(exc, SyncAborted):
                group.call_off(f"engine worker at sync rank {group.rank}: {type(exc).__name__}: {exc}")
                group.abandon()
            raise

    def _sr_stream(self, group, packed_specs: list[tuple[str, list[int], str]]):
        for name, shape, dtype in packed_specs:
            spec = TensorSpec(name, tuple(shape), dtype)
            buf = torch.empty(spec.shape, dtype=spec.torch_dtype, device=self.device)
            broadcast(group, buf, src=0)
            yield spec.name, buf
            del buf

    @replies
    def sr_load_weights(self, packed: list[tuple[str, list[int], str, bytes]]) -> None:
        weights = [
            (name, _unpack_tensor(shape, dtype, data).to(self.device)) for name, shape, dtype, data in packed
        ]
        self._sr_load(weights)

    def _sr_load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        try:
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        except BaseException:
            self._sr_close_reload()
            raise
        finally:
            self._sr_process_tied()

    def _sr_process_tied(self) -> None:
        """Process again every layer that shares a tensor with another (a tied LM head). vLLM's
        reload processes the layers that received weights; a tied head receives none (the
        checkpoint has only the embedding) and keeps what its processing made of the old values:
        on CPU a packed copy of the weight, so it served the previous embedding as logits."""
        holders: dict[int, list[torch.nn.Module]] = {}
        for module in self.model_runner.get_model().modules():
            for param in module.parameters(recurse=False):
                holders.setdefault(id(param), []).append(module)
        tied = [m for modules in holders.values() if len(modules) > 1 for m in modules]
        if not tied:
            return
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            for module in tied:
                method = getattr(module, "quant_method", None)
                if method is not None:
                    method.process_weights_after_loading(module)

    def _sr_close_reload(self) -> None:
        """Close a layer-wise reload that stopped midway. Left open, every layer stays wrapped with
        the tensors it had buffered, and the next reload (which skips layers already open) counts
        them again: a half-loaded layer is processed as soon as the stale and the new tensors add
        up to its size, partly from the stale ones and partly from uninitialised memory, and the
        tensors that arrive after that are dropped as excess. Closing it processes what arrived
        and puts the previous weights back where nothing did; the engine serves a mix until the
        retry, which the driver runs before the engine generates again, replaces every layer."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self.model_runner.get_model(), self.vllm_config.model_config)

    @replies
    def sr_checksum(self) -> float:
        """This worker's share of the model's float64 sum, a chunk at a time (a 7B model's
        embedding is ~2 GB in float64 whole). With tensor parallelism every worker holds its own
        copy of the replicated tensors (norms: vLLM marks only sharded ones with an input or
        output dim), which only rank 0 counts, so the engine's sum over workers counts each once.
        vLLM's CPU layouts pack linear weights into handles it does not expose, so this is a
        change detector, not a digest: ``score`` is what proves the served weights."""
        first = int(getattr(self, "rank", 0)) == 0
        total = 0.0
        with torch.no_grad():
            for p in self.model_runner.model.parameters():
                sharded = (
                    getattr(p, "output_dim", None) is not None or getattr(p, "input_dim", None) is not None
                )
                if sharded or first:
                    for chunk in p.detach().reshape(-1).split(1 << 22):
                        total += float(chunk.double().sum())
        return total
