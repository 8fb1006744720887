"""What the agent loop sends to an OpenAI-compatible endpoint: stop strings (the environment's and
the loop's own), seen by a fake endpoint that records every body."""

from __future__ import annotations

import asyncio
import json

import httpx

from selective_rollout.envs import ENVS
from selective_rollout.integrations.agent_loop import LoopConfig, _reply, environment_task
from selective_rollout.records import Task
from selective_rollout.rollout.engines.openai_engine import OpenAIClient


def recorded_chat(cfg: LoopConfig, stop: tuple[str, ...]) -> dict:
    bodies: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "go"}}], "usage": {}})

    async def call() -> str:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/v1/") as http:
            reply = await _reply(OpenAIClient(http=http), cfg, [{"role": "user", "content": "hi"}], 0, stop)
        return reply.completion.outputs[0].text

    assert asyncio.run(call()) == "go"
    return bodies[0]


def test_stop_strings_of_the_loop_and_of_the_environment_reach_the_endpoint_once_each():
    body = recorded_chat(LoopConfig(model="m", stop=("\n\n",)), ("Observation:", "\n\n"))
    assert body["stop"] == ["\n\n", "Observation:"]
    assert "stop" not in recorded_chat(LoopConfig(model="m"), ())  # none: the key is not sent


def test_an_environments_task_carries_its_stop_strings(tmp_path):
    tasks = tmp_path / "q.jsonl"
    tasks.write_text(
        json.dumps({"id": "q", "split": "train", "question": "1+1?", "answer": 2, "choices": [2]}) + "\n"
    )
    env = ENVS.build("tests.env.arithmetic_env:Arithmetic", {"tasks_file": str(tasks), "stop": ["Q:"]})
    source = environment_task(env, Task("q", "arith", {}))
    assert source.stop == ("Q:",)
