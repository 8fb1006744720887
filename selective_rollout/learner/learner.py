"""One data-parallel learner: a DeepSpeed engine over the policy, run as a Ray actor by ``LearnerGroup``.

Each learner joins its own ``torch.distributed`` world (the learners only; engines are never
in it) and DeepSpeed averages gradients over it. The driver decides everything that must agree
across ranks (which experiences each rank gets, how many micro-batches everyone runs, the
batch's loss denominator); a learner only executes its share, so the ranks stay in lock-step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.constants import default_pg_timeout

from selective_rollout import process_memory
from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner import checkpoint
from selective_rollout.learner.modeling import checksum, export_units, load_policy, token_logprobs
from selective_rollout.learner.objective import MAX_STATS, acting_logprobs, micro_batch_loss
from selective_rollout.learner.packing import MicroBatch, collate, empty_micro_batch
from selective_rollout.models import model_here
from selective_rollout.precision import learner_precision
from selective_rollout.records import Experience
from selective_rollout.weight_sync.collective import (
    SyncAborted,
    TensorSpec,
    broadcast,
    group_on_store,
    host_store,
)

log = logging.getLogger(__name__)


def _skip_shm_comm_build() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory allreduce op (~2.5 min).

    ``TorchBackend`` builds ``deepspeed_shm_comm`` whenever ``deepspeed.ops.__compatible_ops__``
    marks it compatible, with no switch to refuse; gloo does the allreduce without it.
    """
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def owns_clipping(cfg: TrainerConfig) -> bool:
    """fp32 ZeRO-0 clips without recording the norm, so the learner clips there itself (and logs it).
    Under ``bf16-mixed`` DeepSpeed holds fp32 weights too."""
    return cfg.zero_stage == 0 and cfg.precision != "bf16"


def autocast(cfg: TrainerConfig, device: torch.device) -> torch.autocast:
    """The forward's precision context: bf16 matmuls over fp32 weights under ``bf16-mixed``
    (log-probs are still taken in fp32, learner/modeling.py), a no-op otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16-mixed")


def deepspeed_config(cfg: TrainerConfig, world_size: int, cpu: bool = False) -> dict[str, Any]:
    """DeepSpeed config: the learner owns loss scaling and accumulation, DeepSpeed owns ZeRO and
    the optimiser.

    ``managed_gradient_accumulation: false`` makes every ``step()`` the accumulation boundary,
    since the number of micro-batches varies from step to step with the token budget.
    ``torch_adam`` avoids the ~3.5 min CPU FusedAdam JIT build.

    On CPU (gloo) ZeRO-3 gathers sequentially: DeepSpeed 0.19.6's coalesced gather of several
    parameters (``GatheredParameters`` over a LoRA layer, say) waits only for the last of its
    all-gathers, which is enough on one CUDA stream but not with gloo, whose worker threads
    finish them in any order: the others were read half-written (garbage weights, seen in tests).
    """
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.0 if owns_clipping(cfg) else cfg.max_grad_norm,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": cfg.lr,
                "betas": list(cfg.adam_betas),
                "eps": 1e-8,
                "weight_decay": cfg.weight_decay,
                "torch_adam": True,
            },
        },
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if cpu:
        ds["zero_optimization"]["stage3_allgather_sequential"] = True
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    return ds


class LearnerWorker:
    """The body of a learner actor; ``LearnerGroup`` makes it a Ray actor and drives all ranks together."""

    def __init__(self, cfg: dict[str, Any], model_path: str, seed: int, rank: int, world_size: int) -> None:
        self.cfg = TrainerConfig.model_validate(cfg)
        self.model_path = str(model_here(model_path))
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.engine: Any = None
        self.ref_model: torch.nn.Module | None = None
        self.sync_pg: Any = None
        self._grad_norm: float | None = None
        self._world_store: dist.TCPStore | None = None  # rank 0's, from rendezvous_address to setup
        self._sync_store: dist.TCPStore | None = None  # from open_sync_store to init_sync_group

    # -- set-up ------------------------------------------------------------------------------
    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0's address and the port of the store it now hosts for the learners' own world.

        The store listens on a port the system picked until ``setup`` builds the world on it: a
        port found free, closed and named to the other ranks could be taken in between."""
        host = _node_ip()
        self._world_store = host_store(host, self.world_size, default_pg_timeout.total_seconds())
        return host, self._world_store.port

    def _init_world(self, master_addr: str, master_port: int, cuda: bool) -> None:
        """The learners' world on rank 0's store (DeepSpeed then adopts it): rank 0 brings the
        store ``rendezvous_address`` opened, the others connect to it."""
        if self.rank == 0:
            if self._world_store is None:
                raise RuntimeError("setup on rank 0 before rendezvous_address")
            store, self._world_store = self._world_store, None
        else:
            store = dist.TCPStore(
                master_addr, master_port, self.world_size, is_master=False, timeout=default_pg_timeout
            )
        # as DeepSpeed's own initialisation would: CUDA groups bound to this actor's device
        device = {"device_id": torch.device("cuda", 0)} if cuda else {}
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=default_pg_timeout,
            **device,
        )

    def setup(self, master_addr: str, master_port: int) -> None:
        cuda = torch.cuda.is_available()
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        if not cuda:
            _skip_shm_comm_build()
        precision = learner_precision(self.cfg.precision, "cuda" if cuda else "cpu")
        if precision != self.cfg.precision:
            log.info(
                "trainer.precision %s: %s on this %s", self.cfg.precision, precision, "GPU" if cuda else "CPU"
            )
            self.cfg = self.cfg.model_copy(update={"precision": precision})
        self._init_world(master_addr, master_port, cuda)
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
        torch.manual_seed(self.seed)  # the same LoRA init on every rank
        model = load_policy(self.model_path, self.cfg)
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(self.cfg, self.world_size, cpu=not cuda),
            lr_scheduler=self._scheduler,
        )
        if owns_clipping(self.cfg):
            self.engine.optimizer.register_step_pre_hook(self._clip_gradients)
        if self.cfg.kl_coef > 0 and not self.cfg.lora.enabled:
            self.ref_model = load_policy(self.model_path, self.cfg)
            self.ref_model.to(self.device).eval().requires_grad_(False)
        torch.manual_seed(self.seed + self.rank)  # dropout differs per rank, reproducibly

    def _clip_gradients(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Runs just before the optimiser update, when DeepSpeed has already averaged the gradients."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        max_norm = self.cfg.max_grad_norm or float("inf")
        self._grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def _scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        warmup = self.cfg.warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )

    def device_type(self) -> str:
        return self.device.type

    def sees(self, path: str) -> bool:
        """Whether ``path`` exists from this learner's node (is the run folder shared?)."""
        return Path(path).exists()

    def location(self) -> dict[str, Any]:
        """This learner's Ray node and process (``placement.json``)."""
        from selective_rollout.process_memory import here

        return here()

    def resident_gb(self) -> float:
        """Resident memory of this learner's process (``system/rss_gb/learner_*``)."""
        return process_memory.resident_gb()

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    # -- training ----------------------------------------------------------------------------
    def _ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """The frozen initial policy's log-probs at the micro-batch's policy tokens (0 elsewhere)."""
        with torch.no_grad():
            if self.ref_model is not None:
                return acting_logprobs(self.ref_model, mb, self.cfg).logprobs
            with self.module.disable_adapter():
                return acting_logprobs(self.module, mb, self.cfg).logprobs

    def train_step(
        self,
        shard: list[Experience],
        advantages: list[float],
        plan: list[list[int]],
        denominator: float,
        staleness: list[list[int]],
    ) -> dict[str, float]:
        """Run this rank's micro-batches (``[]`` = an empty one), then one optimiser step on all ranks.
        ``staleness`` gives each experience's per-token learner updates since its sampling weights.

        Each micro-batch loss is its exact share of the batch loss; it is scaled by the world
        size because DeepSpeed *averages* gradients across ranks, whose sum is what the loss needs.
        """
        self.engine.train()
        sums: dict[str, float] = {}
        for indices in plan:
            if indices:
                mb = collate(
                    [shard[i] for i in indices],
                    [advantages[i] for i in indices],
                    staleness=[staleness[i] for i in indices],
                )
            else:
                mb = empty_micro_batch()
            with autocast(self.cfg, self.device):
                loss, stats = micro_batch_loss(
                    self.engine, mb.to(self.device), self.cfg, denominator, self._ref_logprobs
                )
            self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
            for k, v in stats.items():
                sums[k] = max(sums.get(k, 0.0), v) if k in MAX_STATS else sums.get(k, 0.0) + v
        lr = float(self.engine.get_lr()[0])
        self.engine.step()
        grad_norm = self._grad_norm if owns_clipping(self.cfg) else self.engine.get_global_grad_norm()
        sums["grad_norm"] = float("nan") if grad_norm is None else float(grad_norm)
        sums["lr"] = lr
        return sums

    def logprobs(self, token_ids: list[list[int]]) -> list[list[float]]:
        """Current-policy log-prob of every token after the first, one sequence at a time."""
        self.engine.eval()
        out = []
        with torch.no_grad(), autocast(self.cfg, self.device):
            for ids in token_ids:
                x = torch.tensor([ids], dtype=torch.long, device=self.device)
                out.append(token_logprobs(self.module, x, torch.ones_like(x)).logprobs[0].float().tolist())
        return out

    # -- weights -----------------------------------------------------------------------------
    def _exported(self, materialize: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight the engines load, in engine names, one module whole at a time.

        Under ZeRO-3 each ``export_units`` unit's partitions are gathered (a collective: every
        rank walks the same units in the same order), its tensors yielded, and the unit released
        before the next is gathered: the extra memory is about the largest module (the
        embedding), never the model. A LoRA layer is one unit with its adapters, so its merged
        copy is made while they are whole and is as big as the base weight it replaces. The
        iterator must be exhausted on every rank, or the others wait in a gather;
        ``materialize=False`` only takes part in the gathers (a rank that sends nothing).
        """
        for unit in export_units(self.module):
            with deepspeed.zero.GatheredParameters(
                unit.params, modifier_rank=None, enabled=self.cfg.zero_stage == 3
            ):
                if materialize:
                    yield from unit.weights()

    def _join_gathers(self) -> None:
        """A rank other than 0 under ZeRO-3: take part in rank 0's gathers (nothing otherwise)."""
        if self.cfg.zero_stage == 3:
            for _ in self._exported(materialize=False):
                pass

    def weight_specs(self) -> list[TensorSpec]:
        if self.rank != 0:
            self._join_gathers()
            return []
        return [TensorSpec.of(n, t) for n, t in self._exported()]

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The weights engines load, on CPU (the object-store path); every rank must call it under
        ZeRO-3. Gathered module by module: the accelerator holds one module extra, the host the model."""
        if self.rank != 0:
            self._join_gathers()
            return {}
        return {name: tensor.detach().cpu().clone() for name, tensor in self._exported()}

    def weights_checksum(self, dtype: str | None = None) -> float:
        """This rank's replica (every rank computes it: ``replica_checksums`` compares them)."""
        return checksum(self._exported(), dtype)

    def open_sync_store(self, world_size: int) -> tuple[str, int]:
        """Open the store of the learner->engines group (rank 0's) and return its address, for the
        engines to join ``init_sync_group``'s group at; the port is the system's pick and held."""
        host = _node_ip()
        self._sync_store = host_store(host, world_size)
        return host, self._sync_store.port

    def init_sync_group(self, world_size: int, backend: str) -> None:
        """Host the learner->engines group as its rank 0 (engines join with ranks 1..N), on the
        store ``open_sync_store`` opened."""
        if self._sync_store is None:
            raise RuntimeError("init_sync_group before open_sync_store")
        store, self._sync_store = self._sync_store, None
        self.sync_pg = group_on_store(store, backend, 0, world_size)

    def send_weights(self) -> None:
        """Broadcast every exported tensor, in ``weight_specs`` order, to the engines: one module
        gathered, sent and released at a time (rank 0 sends; under ZeRO-3 the others gather with it).

        When the sync is called off or a broadcast fails (``weight_sync.collective.SyncAborted``) rank 0
        stops sending but, under ZeRO-3, walks the rest of the gathers so the other learners are
        not left waiting in one; then it raises, and the group must be rebuilt."""
        if self.rank != 0:
            self._join_gathers()
            return
        if self.sync_pg is None:
            raise RuntimeError("send_weights before init_sync_group (or after a failed sync)")
        failure: SyncAborted | None = None
        for _, tensor in self._exported(materialize=True):
            if failure is not None:
                continue  # only the ZeRO-3 gathers left
            try:
                broadcast(self.sync_pg, tensor.detach().contiguous(), src=0)
            except SyncAborted as exc:
                failure = exc
                if self.cfg.zero_stage != 3:
                    break
        if failure is not None:
            self.sync_pg = None
            raise failure

    # -- checkpoints -------------------------------------------------------------------------
    def save(self, staging: str) -> None:
        """Every rank writes its part of the DeepSpeed state (ZeRO shards) and its RNG state."""
        path = Path(staging)
        path.mkdir(parents=True, exist_ok=True)
        self.engine.save_checkpoint(
            str(path),
            tag=checkpoint.DS_TAG,
            save_latest=False,
            exclude_frozen_parameters=self.cfg.lora.enabled,
        )
        checkpoint.save_rng(path / f"rng_rank{self.rank}.pt")

    def load(self, path: str) -> None:
        load_path, _ = self.engine.load_checkpoint(
            path, tag=checkpoint.DS_TAG, load_module_strict=not self.cfg.lora.enabled
        )
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed state (tag {checkpoint.DS_TAG!r}) in checkpoint {path}")
        rng_file = Path(path) / f"rng_rank{self.rank}.pt"
        if not rng_file.is_file():
            raise FileNotFoundError(f"checkpoint {path} has no RNG state for learner rank {self.rank}")
        checkpoint.load_rng(rng_file)


def _node_ip() -> str:
    """This node's address as Ray knows it (what the other actors reach it at)."""
    import ray

    return ray.util.get_node_ip_address()
