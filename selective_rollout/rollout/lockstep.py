"""The paper's rollout loop, kept as the reference the concurrent coordinator is measured against.

One group at a time; each turn every live trajectory of the group sends its request at once (one
engine round, batched by the engine), then all take one environment step together, and the next
round starts only after that step. It plays the same ``Turns`` as the concurrent coordinator and
is scheduled, settled and logged by the same ``GroupScheduler``, so an A/B of the two measures the
schedule alone. ``rollout.mode: lockstep`` selects it.
"""

from __future__ import annotations

import asyncio

from selective_rollout.rollout.group_run import GroupRun
from selective_rollout.rollout.scheduler import GroupScheduler


class LockstepRollout(GroupScheduler):
    """Each trajectory keeps its KV session across turns, as the paper's vLLM server with
    ``enable_prefix_caching=True`` re-uses the dialogue's prefix: a lock-step reference that
    re-prefilled every turn would hand the concurrent coordinator a caching win that is not
    concurrency's."""

    in_flight = 1

    async def play(self, group: GroupRun) -> None:
        engine = self.turns.slots[group.engine_index]
        while not group.life.stopped:
            live = [t for t in group.trajectories if t.live]
            if not live:
                return
            replies = await asyncio.gather(*(self.turns.generate(group, t, engine) for t in live))
            actions = {t.episode_id: reply.command for t, reply in zip(live, replies, strict=True)}
            states = await self.turns.step(group, actions)
            for t, reply in zip(live, replies, strict=True):
                self.turns.apply(group, t, reply, states[t.episode_id])
