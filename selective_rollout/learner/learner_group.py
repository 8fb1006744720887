"""``LearnerGroup``: the driver's handle over N data-parallel learner actors.

The driver is where the batch is seen whole, so everything the ranks must agree on is decided
here: advantages (per group, over the whole batch), the loss denominator, which learner gets
which groups, and how many micro-batches every learner runs. Learners only execute.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from selective_rollout.config.trainer import TrainerConfig
from selective_rollout.learner import checkpoint
from selective_rollout.learner.advantages import compute_advantages
from selective_rollout.learner.learner import LearnerWorker
from selective_rollout.learner.losses import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES
from selective_rollout.learner.objective import MAX_STATS, ZERO_ADV
from selective_rollout.learner.packing import check_experience, plan_micro_batches
from selective_rollout.records import Experience
from selective_rollout.weight_sync.collective import TensorSpec, call_off, sync_ranks

# how long the members of a called-off sync get to stop before the failure is reported anyway
SYNC_ABORT_GRACE_S = 60.0


class WeightSyncFailed(RuntimeError):
    """A weight sync stopped because a member failed; ``dead_engines`` are the indices (in the
    list given to ``sync_weights``) of the engines whose actor died."""

    def __init__(self, message: str, dead_engines: list[int]) -> None:
        super().__init__(message)
        self.dead_engines = dead_engines

    def __reduce__(self) -> tuple:
        return (type(self), (str(self), self.dead_engines))


def _actor_id(actor: Any) -> str:
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex()[:12] if actor_id is not None else "?"


def _summary(exc: BaseException) -> str:
    """One line for a failed member: the error's type and first line (a Ray task error's cause)."""
    cause = getattr(exc, "cause", None) or exc
    text = (str(cause).strip().splitlines() or [""])[0][:300]
    return f"{type(cause).__name__}: {text}"


def shard_by_group(batch: Sequence[Experience], num_shards: int) -> list[list[int]]:
    """Indices of ``batch`` per learner: whole groups, biggest first onto the least-loaded learner.

    Keeping a group on one learner keeps its segments together; balancing by tokens keeps the
    learners' step times close, since they wait for each other at every step.
    """
    groups: dict[str, list[int]] = {}
    for i, exp in enumerate(batch):
        groups.setdefault(exp.group_id, []).append(i)
    load = [0] * num_shards
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    sized = sorted(groups.values(), key=lambda idx: -sum(len(batch[i].token_ids) for i in idx))
    for idx in sized:
        target = min(range(num_shards), key=lambda r: (load[r], r))
        shards[target].extend(idx)
        load[target] += sum(len(batch[i].token_ids) for i in idx)
    return [sorted(s) for s in shards]


def staleness_metrics(batch: Sequence[Experience], staleness: Sequence[int]) -> dict[str, float]:
    """How far behind the learner the batch's sampling weights were, over its groups (each at its
    stalest experience's lag): mean, max, and the number of groups at each lag
    (``offpolicy/groups_lag_<n>``)."""
    by_group: dict[str, int] = {}
    for exp, lag in zip(batch, staleness, strict=True):
        by_group[exp.group_id] = max(lag, by_group.get(exp.group_id, 0))
    lags = list(by_group.values())
    metrics = {
        "offpolicy/staleness_mean": sum(lags) / len(lags),
        "offpolicy/staleness_max": float(max(lags)),
    }
    for lag in sorted(set(lags)):
        metrics[f"offpolicy/groups_lag_{lag}"] = float(lags.count(lag))
    return metrics


def weight_metrics(total: dict[str, float], applied: bool) -> dict[str, float]:
    """The behaviour importance weights of the stale tokens the learner trained on (none: only
    the share, 0): mean and max, the share the loss truncated, and the effective sample size
    ``(sum w)^2 / (n sum w^2)`` as a share of the ``n`` stale tokens; ``offpolicy/is_applied`` says
    whether the policy loss weighed the tokens by them (``decoupled_ppo``) or they were only
    measured (``ppo_clip``)."""
    stale, policy = total["stale_tokens"], max(total["policy_tokens"], 1.0)
    metrics = {"offpolicy/stale_token_frac": stale / policy, "offpolicy/is_applied": float(applied)}
    if stale:
        metrics.update(
            {
                "offpolicy/is_mean": total["is_sum"] / stale,
                "offpolicy/is_max": total["is_max"],
                "offpolicy/is_truncated_frac": total["is_truncated"] / stale,
                "offpolicy/ess": total["is_sum"] ** 2 / (stale * max(total["is_sq_sum"], 1e-30)),
            }
        )
    return metrics


class LearnerGroup:
    """N DeepSpeed learners (data parallel) over one policy; Ray must be initialised."""

    latest_checkpoint = staticmethod(checkpoint.latest_checkpoint)

    def __init__(
        self,
        cfg: TrainerConfig,
        model_path: str | Path,
        seed: int = 0,
        actor_options: dict | None = None,
        wait_started: Callable[[dict[Any, str]], None] | None = None,
    ) -> None:
        """``wait_started`` receives {ref: "learner r"} of a first call to each actor and returns
        once they have answered (the driver's ``placement.wait_for_actors`` stops the run when Ray
        cannot place them); without it, the group waits as long as Ray does."""
        if not ray.is_initialized():
            raise RuntimeError("LearnerGroup needs a running Ray: call ray.init() first")
        self.cfg = cfg
        n = cfg.num_learners
        options = {"num_cpus": 1, **(actor_options or {})}
        actor_cls = ray.remote(LearnerWorker)
        payload = cfg.model_dump(mode="json")
        self.actors = [
            actor_cls.options(**options).remote(payload, str(model_path), seed, rank, n) for rank in range(n)
        ]
        if wait_started is not None:
            wait_started({a.location.remote(): f"learner {r}" for r, a in enumerate(self.actors)})
        host, port = ray.get(self.actors[0].rendezvous_address.remote())
        ray.get([a.setup.remote(host, port) for a in self.actors])
        self._device_type: str = ray.get(self.actors[0].device_type.remote())
        self._sync_engines: list = []
        self._specs: list[TensorSpec] = []
        self._store_address: tuple[str, int] | None = None

    def _on_all(self, method: str, *args: Any) -> list[Any]:
        """Call a method on every learner at once (gathers under ZeRO-3 are collectives)."""
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def _on_rank0(self, method: str, *args: Any) -> Any:
        if self.cfg.zero_stage == 3:
            return self._on_all(method, *args)[0]
        return ray.get(getattr(self.actors[0], method).remote(*args))

    # -- training ----------------------------------------------------------------------------
    def train_step(self, batch: list[Experience], version: int | None = None) -> dict[str, float]:
        """One optimiser step over ``batch``; returns its ``train/`` and ``offpolicy/`` metrics.

        ``version`` is the learner's policy version (updates taken so far): each policy token's
        staleness is ``version`` minus its version (``Experience.token_lags``; 0 throughout when
        not given), what a loss that corrects off-policy data (``decoupled_ppo``) weighs it by.

        ``train/effective_grad_l2`` is the L2 norm of the per-token coefficients ``w_t A_t`` that
        multiply ``grad log pi`` at ratio 1: it shrinks when zero-advantage tokens dilute the
        aggregation denominator, independently of the model's own gradient scale.
        """
        if not batch:
            raise ValueError("train_step: the batch is empty")
        for exp in batch:
            check_experience(exp)
        # the constrained policy's tokens: what it chose, not what it was forced to
        if self.cfg.constrained_logprobs:
            batch = [exp.without_forced_tokens() for exp in batch]
        start = time.perf_counter()
        try:
            staleness = [[0] * len(e.token_ids) if version is None else e.token_lags(version) for e in batch]
        except ValueError as exc:
            raise ValueError(f"train_step: {exc}") from None
        advantages = compute_advantages(batch, ADVANTAGES.build(self.cfg.advantage, self.cfg))
        aggregation = AGGREGATIONS.build(self.cfg.loss_agg, self.cfg)
        denominator = aggregation.denominator([e.num_policy_tokens for e in batch])
        informative = [i for i, a in enumerate(advantages) if abs(a) > ZERO_ADV]
        full = {
            "train/batch_size": float(len(batch)),
            "train/effective_batch": float(sum(1 for i in informative if batch[i].num_policy_tokens)),
            "train/zero_adv_token_frac": sum(
                e.num_policy_tokens for e, a in zip(batch, advantages, strict=True) if abs(a) <= ZERO_ADV
            )
            / max(1, sum(e.num_policy_tokens for e in batch)),
            **staleness_metrics(batch, [max(lags) for lags in staleness]),
        }
        if self.cfg.kl_coef == 0 and POLICY_LOSSES.get(self.cfg.policy_loss).no_gradient_at_zero_advantage:
            # Without a KL term a zero-advantage sequence adds exactly zero gradient under PPO-clip;
            # it still counts in the denominator above (the dilution), so skipping its forward and
            # backward is exact and saves the learner the cost of groups that teach nothing.
            if not informative:
                return {**full, "train/skipped": 1.0, "train/step_s": time.perf_counter() - start}
            batch = [batch[i] for i in informative]
            advantages = [advantages[i] for i in informative]
            staleness = [staleness[i] for i in informative]
        shards = shard_by_group(batch, len(self.actors))
        plans = [
            plan_micro_batches([len(batch[i].token_ids) for i in s], self.cfg.micro_batch_tokens)
            for s in shards
        ]
        n_micro = max(len(p) for p in plans)
        calls = [
            actor.train_step.remote(
                [batch[i] for i in shard],
                [advantages[i] for i in shard],
                plan + [[]] * (n_micro - len(plan)),
                denominator,
                [staleness[i] for i in shard],
            )
            for actor, shard, plan in zip(self.actors, shards, plans, strict=True)
        ]
        results = ray.get(calls)
        elapsed = time.perf_counter() - start
        total = {
            k: (max if k in MAX_STATS else sum)(r[k] for r in results)
            for k in results[0]
            if k not in ("grad_norm", "lr")
        }
        policy_tokens = max(total["policy_tokens"], 1.0)
        return {
            "train/loss": total["loss_sum"],
            "train/grad_norm": results[0]["grad_norm"],
            "train/lr": results[0]["lr"],
            "train/kl": total["kl_sum"] / policy_tokens,
            "train/entropy": total["entropy_sum"] / policy_tokens,
            "train/clip_frac": total["clip_sum"] / policy_tokens,
            # mean |log p_learner - log p_engine| of the sampled tokens (0 when both agree exactly)
            "train/engine_logprob_gap": total["engine_gap_sum"] / policy_tokens,
            "train/effective_grad_l2": math.sqrt(total["signal_sq_sum"]),
            **full,
            "train/skipped": 0.0,
            "train/trained_sequences": float(len(batch)),
            "train/policy_tokens": total["policy_tokens"],
            "train/tokens": total["tokens"],
            "train/padding_frac": 1.0 - total["tokens"] / max(total["padded_tokens"], 1.0),
            "train/micro_batches": float(n_micro),
            "train/step_s": elapsed,
            "train/tokens_per_s": total["tokens"] / elapsed,
            **weight_metrics(
                total, math.isfinite(POLICY_LOSSES.build(self.cfg.policy_loss, self.cfg).weight_cap())
            ),
        }

    def logprobs(self, token_ids: list[list[int]]) -> list[list[float]]:
        """The current policy's log-prob of every token after the first (rank 0's replica)."""
        return self._on_rank0("logprobs", token_ids)

    # -- weight sync -------------------------------------------------------------------------
    def sync_method(self) -> str:
        """``trainer.weight_sync`` as it runs: ``auto`` is NCCL where the learners are on CUDA, else
        gloo; ``object_store`` is refused for a model too big to copy whole (``check_object_store``)."""
        if self.cfg.weight_sync == "auto":
            return "nccl" if self._device_type == "cuda" else "gloo"
        if self.cfg.weight_sync == "object_store":
            self.check_object_store()
        return self.cfg.weight_sync

    # object_store puts the whole model into Ray's object store at every sync and each engine copies
    # it out (and its workers once more): ~15 GB per engine at 7B in bf16, against one broadcast
    # per tensor over a process group. A run above this many parameters is refused.
    OBJECT_STORE_MAX_PARAMS = 1_000_000_000

    def check_object_store(self) -> None:
        """Refuse ``trainer.weight_sync=object_store`` above ``OBJECT_STORE_MAX_PARAMS`` parameters of
        the weights engines receive (LoRA merged), read once from rank 0; the run's first sync is
        at start-up, so a 7B run stops in seconds instead of spilling the object store later."""
        specs = getattr(self, "_object_store_specs", None)
        if specs is None:
            specs = self._object_store_specs = self._on_rank0("weight_specs")
        params = sum(math.prod(spec.shape) for spec in specs)
        if params <= self.OBJECT_STORE_MAX_PARAMS:
            return
        size_gb = sum(math.prod(spec.shape) * spec.torch_dtype.itemsize for spec in specs) / 1e9
        raise ValueError(
            f"trainer.weight_sync=object_store with a model of {params:,} parameters ({size_gb:.2f} GB "
            "of weights): every sync copies them whole through Ray's object store for each engine, "
            f"refused above {self.OBJECT_STORE_MAX_PARAMS:,}; use trainer.weight_sync=nccl (GPUs) or "
            "gloo (auto picks between them)"
        )

    def sync_weights(self, engines: list, version: int) -> float:
        """Send the current weights, policy version ``version``, to every engine; returns the
        seconds it took.

        Over a process group (rank 0 = this group's rank-0 learner, then every engine worker,
        ``weight_sync.collective.sync_ranks``; built on the
        first call and rebuilt when the engine set changes): the specs go through Ray, then one
        broadcast per tensor. ``object_store``: the engines load a Ray object of all tensors.

        Every member's call is watched: the first that fails (an engine actor died) calls the
        sync off (``weight_sync.collective.call_off``), the others abandon the group within about a second
        instead of waiting for the collective's timeout, and ``WeightSyncFailed`` names the dead
        engines; the next call rebuilds the group. Engines that were receiving hold partly
        updated weights until a sync succeeds (``RunActors.sync_weights`` replaces the dead ones
        and syncs again at once).
        """
        start = time.perf_counter()
        if not engines:
            return 0.0
        method = self.sync_method()
        if method == "object_store":
            refs = [a.export_weights.remote() for a in self.actors]
            loads = [e.load_weights.remote(refs[0], version) for e in engines]
            self._await_sync(engines, loads, {ref: f"learner {r}" for r, ref in enumerate(refs)}, None)
            return time.perf_counter() - start
        if list(engines) != self._sync_engines:
            self._connect(list(engines), method)
        receives = [e.receive_weights.remote(self._specs, version) for e in engines]
        sends = {a.send_weights.remote(): f"learner {r}" for r, a in enumerate(self.actors)}
        self._await_sync(engines, receives, sends, self._store_address)
        return time.perf_counter() - start

    def _await_sync(
        self, engines: list, receives: list, learners: dict, store: tuple[str, int] | None
    ) -> None:
        """Wait for every member's call (``receives``: one per engine; ``learners``: ref -> name);
        on the first failure call the sync off (through the group's store at ``store``), give
        the rest ``SYNC_ABORT_GRACE_S`` to stop, and raise ``WeightSyncFailed``."""
        owner = {ref: f"engine {i}" for i, ref in enumerate(receives)} | learners
        pending, failures, deadline = list(owner), {}, None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                break  # past the grace: report what is still hanging
            try:
                ray.get(done[0])
            except Exception as exc:  # every failure is reported below
                if not failures and store is not None:
                    call_off(*store, f"{owner[done[0]]} failed: {_summary(exc)}")
                failures[done[0]] = exc
                deadline = deadline or time.monotonic() + SYNC_ABORT_GRACE_S
        if not failures:
            return
        self._sync_engines = []  # every member abandoned (or will abandon) this group
        dead = [i for i, ref in enumerate(receives) if isinstance(failures.get(ref), RayActorError)]
        lines = [f"{owner[ref]}: {_summary(exc)}" for ref, exc in failures.items()]
        late = f"still in the sync {SYNC_ABORT_GRACE_S:.0f} s after it was called off"
        lines += [f"{owner[ref]}: {late}" for ref in pending]
        what = (
            "engine " + ", ".join(f"{i} (actor {_actor_id(engines[i])})" for i in dead) + " died during it"
            if dead
            else "a member failed"
        )
        told = "; the other members were told to stop" if store is not None else ""
        message = f"weight sync failed: {what}{told}\n  " + "\n  ".join(lines)
        raise WeightSyncFailed(message, dead)

    def _connect(self, engines: list, backend: str) -> None:
        """Build the sync group: rank 0 opens its store first, on a port it holds from then on,
        then it and every engine join at once (a gloo group's members wait for each other)."""
        firsts, world = sync_ranks(ray.get([e.sync_workers.remote() for e in engines]))
        host, port = ray.get(self.actors[0].open_sync_store.remote(world))
        joins = [
            e.init_weight_sync.remote(host, port, first, world, backend)
            for first, e in zip(firsts, engines, strict=True)
        ]
        ray.get([self.actors[0].init_sync_group.remote(world, backend), *joins])
        self._store_address = (host, port)
        self._specs = self._on_rank0("weight_specs")
        self._sync_engines = engines

    def weights_checksum(self, dtype: str | None = None) -> float:
        """Sum of float64 sums of the weights engines receive (LoRA merged), on rank 0; ``dtype``
        rounds them to an engine's precision first (``engine.dtype``)."""
        return self._on_rank0("weights_checksum", dtype)

    def sees(self, path: str | Path) -> list[bool]:
        """Whether each learner rank sees ``path`` (checkpoints go where the learners write)."""
        return self._on_all("sees", str(path))

    def locations(self) -> list[dict[str, Any]]:
        """Where each learner rank runs, in rank order."""
        return self._on_all("location")

    def resident_gb(self) -> list[float]:
        """Resident memory of each learner rank's process, in rank order."""
        return self._on_all("resident_gb")

    def replica_checksums(self) -> list[float]:
        """``weights_checksum`` of every learner: data-parallel replicas must agree exactly."""
        return self._on_all("weights_checksum")

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | Path, extra_state: dict) -> Path:
        """Save ``directory/iter_XXXXXXXX`` atomically (named by ``extra_state["iteration"]``,
        JSON-serialisable) and keep the newest ``keep_checkpoints``.

        ``directory`` must be visible to every learner (a shared file system across nodes).
        """
        iteration = int(extra_state["iteration"])
        staging = checkpoint.staging_dir(directory, iteration)
        if staging.exists():
            shutil.rmtree(staging)
        self._on_all("save", str(staging))
        final = checkpoint.publish(
            staging, Path(directory) / checkpoint.checkpoint_name(iteration), dict(extra_state)
        )
        checkpoint.prune(directory, self.cfg.keep_checkpoints)
        return final

    def load_checkpoint(self, directory: str | Path) -> dict:
        """Restore a checkpoint (a ``step_*`` folder, or the latest one under a root); returns extra_state."""
        path = Path(directory)
        if not (path / checkpoint.EXTRA_STATE).is_file():
            latest = checkpoint.latest_checkpoint(path)
            if latest is None:
                raise FileNotFoundError(f"no complete checkpoint at or under {path}")
            path = latest
        extra = checkpoint.read_extra_state(path)
        self._on_all("load", str(path))
        return extra

    def resume(self, directory: str | Path) -> dict | None:
        """``trainer.resume``: auto loads the latest complete checkpoint under ``directory`` if any."""
        if self.cfg.resume == "never" or checkpoint.latest_checkpoint(directory) is None:
            return None
        return self.load_checkpoint(directory)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
