"""A two-turn arithmetic environment whose second turn can be held back: the first turn asks the
agent to say ``ready``; the answer choices come once a file the test owns exists (``hold``), so
a test decides what happens before an episode's second reply is sampled (weights that reach the
engines while the rollout is in flight, say) instead of racing it. Selected by its path
(``env.name=tests.env.held_env:Held``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from tests.env.arithmetic_env import Arithmetic, ArithmeticParams, ArithmeticSource, QuestionEpisode, Shown

HOLD_TIMEOUT_S = 300.0  # a test whose release never comes fails on its assertions, not by hanging


class HeldParams(ArithmeticParams):
    armed: str = Field("", description="while this file exists, a second turn waits for `release`")
    release: str = Field("", description="the file that lets a held second turn go on")


@dataclass
class HeldEpisode(QuestionEpisode):
    armed: str = ""
    release: str = ""
    ready: bool = False

    def reset(self) -> Shown:
        return Shown(f"Your task is to: answer. {self.question} Say ready first.", ["ready"])

    def step(self, command: str) -> Shown:
        if self.ready:
            return super().step(command)
        self.ready = True
        if self.armed and Path(self.armed).exists():
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while not Path(self.release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return Shown(self.question, [f"answer {c}" for c in self.choices])


@dataclass(frozen=True)
class HeldSource(ArithmeticSource):
    armed: str = ""
    release: str = ""

    def open(self, task: Any, n: int) -> list[Any]:
        return [
            HeldEpisode(e.question, e.answer, e.choices, self.armed, self.release)
            for e in super().open(task, n)
        ]


class Held(Arithmetic):
    """Arithmetic questions in two turns, the second held while ``armed`` exists until ``release``."""

    Params = HeldParams
    params: HeldParams

    def source(self) -> HeldSource:
        return HeldSource(armed=self.params.armed, release=self.params.release)

    def walkthrough(self, task: Any) -> list[str]:
        return ["ready", *super().walkthrough(task)]
