"""A test environment of a non-folder kind: arithmetic questions read from a JSONL file, one line
per task (``{"id", "split", "question", "answer", "choices"}``). It is one file and is selected by
its path (``env.name=tests.env.arithmetic_env:Arithmetic``): no line in plugins.py, no change to
the config, the coordinator or the driver.

An episode shows the question and the admissible answers; one ``answer N`` ends it, won when N is
right. Its walkthrough is the right answer, so the warm start clones it like any other."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from selective_rollout.envs.base import Environment, EnvParams, Episode, PromptText, TaskError
from selective_rollout.records import Task


class ArithmeticParams(EnvParams):
    tasks_file: str = Field("", description="the JSONL file of questions (one task per line)")


@dataclass
class Shown:
    obs: str
    admissible: list[str]
    won: bool = False
    lost: bool = False

    @property
    def done(self) -> bool:
        return self.won or self.lost


@dataclass
class QuestionEpisode:
    question: str
    answer: int
    choices: list[int] = field(default_factory=list)

    def reset(self) -> Shown:
        return Shown(f"Your task is to: answer. {self.question}", [f"answer {c}" for c in self.choices])

    def step(self, command: str) -> Shown:
        won = command.strip() == f"answer {self.answer}"
        return Shown("Right." if won else "Wrong.", [], won=won, lost=not won)

    def close(self) -> None:
        """Nothing to free."""


@dataclass(frozen=True)
class ArithmeticSource:
    errors: tuple[type[Exception], ...] = ()

    def prepare(self) -> None:
        """Nothing to set up."""

    def open(self, task: Task, n: int) -> list[Episode]:
        p = task.payload
        if "question" not in p or "answer" not in p:
            raise TaskError(f"{task.task_id}: a question needs 'question' and 'answer'")
        return [
            QuestionEpisode(p["question"], int(p["answer"]), list(p.get("choices", []))) for _ in range(n)
        ]

    def task_sentence(self, first: Any) -> str:
        return first.obs.split("Your task is to: ", 1)[-1]

    def describe(self, task: Task) -> str:
        return f"question {task.task_id}"


class Arithmetic(Environment):
    """Arithmetic questions from a JSONL file (a test environment of a non-folder kind)."""

    Params = ArithmeticParams
    params: ArithmeticParams
    prompt = PromptText(world="an arithmetic quiz", commands="answer <number>")

    def tasks(self, split: str) -> list[Task]:
        path = Path(self.params.tasks_file)
        if not path.is_file():
            raise FileNotFoundError(f"env.tasks_file: no such file: {path}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [
            Task(
                row["id"],
                row.get("type", "arithmetic"),
                {k: v for k, v in row.items() if k not in ("id", "split")},
            )
            for row in rows
            if row.get("split", "train") == split
        ]

    def cache_key(self) -> list[Any]:
        return [str(Path(self.params.tasks_file).resolve())]

    def source(self) -> ArithmeticSource:
        return ArithmeticSource()

    def walkthrough(self, task: Task) -> list[str]:
        return [f"answer {task.payload['answer']}"]
