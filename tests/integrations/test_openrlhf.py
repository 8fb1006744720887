"""The OpenRLHF plug-in on CPU: real SmolLM2 + real ALFWorld episodes through OpenRLHF's own executor loop.

OpenRLHF is installed ``--no-deps`` (docs/openrlhf.md); its GPU-only imports (vllm) are shimmed here,
in the test, never in the package. The engine adapter below stands in for ``RolloutRayActor``: its
``generate`` has the same signature and, like vLLM's AsyncLLM, aborts its request when cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import types
from types import SimpleNamespace

import pytest

pytest.importorskip("openrlhf", reason="openrlhf not installed: pip install --no-deps openrlhf==0.11.2")

from selective_rollout.gate import build_gate
from selective_rollout.rollout.engines.base import SamplingParams

MAX_REPLY_TOKENS = 12
G = 2


class OpenRLHFStyleEngine:
    """``RolloutRayActor.generate`` / ``generate_responses`` over our TransformersEngine."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.aborted: list[str] = []
        self._ids = itertools.count()

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        rid = f"orl-{next(self._ids)}"
        sp = SamplingParams(max_tokens=min(sampling_params.max_tokens, MAX_REPLY_TOKENS), temperature=0.0)
        task = asyncio.ensure_future(self.engine.generate(rid, list(prompt_token_ids), sp))
        try:
            done = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self.engine.abort([rid])
            finished = await task
            self.aborted.append(finished.outputs[0].finish_reason)
            raise
        o = done.outputs[0]
        out = SimpleNamespace(token_ids=o.token_ids, text=o.text, finish_reason=o.finish_reason, logprobs=[])
        return SimpleNamespace(outputs=[out])

    async def generate_responses(self, executor, prompt, label, max_length, tokenizer, n):
        sampling = SimpleNamespace(max_tokens=None, temperature=0.0, logprobs=None)
        calls = [executor.execute(prompt, label, sampling, max_length, tokenizer, self) for _ in range(n)]
        return await asyncio.gather(*calls)


@pytest.fixture(scope="module")
def engine(smollm2_path):
    from selective_rollout.config.engine import EngineConfig
    from selective_rollout.rollout.engines.transformers_engine import TransformersEngine

    return TransformersEngine(EngineConfig(), smollm2_path)


@pytest.fixture(scope="module")
def agent_module(monkeypatch_module):
    monkeypatch_module.setenv("SR_N_SAMPLES", str(G))
    monkeypatch_module.setenv("SR_MAX_STEPS", "3")
    import selective_rollout.integrations.openrlhf_alfworld_agent as mod

    return mod


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _run(agent_module, engine, tokenizer, game_dir, gate):
    executor = agent_module.AgentExecutor()
    executor.gate = gate
    orl = OpenRLHFStyleEngine(engine)
    responses = asyncio.run(orl.generate_responses(executor, "task", str(game_dir), 4096, tokenizer, G))
    return executor, orl, responses


@pytest.fixture(scope="module")
def game(tiny_games):
    return next((tiny_games / "train").rglob("game.tw-pddl")).parent


@pytest.fixture(scope="module")
def cut_run(agent_module, engine, smollm2_tokenizer, game):
    # greedy decoding: both samples take the same first action, so D_1 = 0 and the gate fires at step 1
    return _run(agent_module, engine, smollm2_tokenizer, game, build_gate("prefix_edit", k=1, tau=0.12))


@pytest.fixture(scope="module")
def ungated_run(agent_module, engine, smollm2_tokenizer, game):
    return _run(agent_module, engine, smollm2_tokenizer, game, build_gate("none"))


def test_agent_file_loads_the_way_openrlhf_loads_it(agent_module, monkeypatch) -> None:
    from openrlhf.utils.agent import AgentExecutorBase

    executor = agent_module.AgentExecutor()
    assert isinstance(executor, AgentExecutorBase) and executor.n == G
    monkeypatch.delenv("SR_N_SAMPLES")
    with pytest.raises(RuntimeError, match="SR_N_SAMPLES"):
        agent_module.AgentExecutor()


def test_converged_group_is_cut_aborted_and_marked(cut_run):
    executor, orl, responses = cut_run
    assert executor.groups_started == 1 and executor.groups_cut == 1
    assert len(responses) == G
    for r in responses:
        assert r["reward"] == 0.0 and r["scores"] == 0.0
        assert r["extra_logs"]["sr_gate_cut"] == 1.0 and r["extra_logs"]["sr_gate_step"] == 1.0
        assert len(r["action_ranges"]) <= 2  # step 1, and at most one aborted reply
    # the sample that moved on to step 2 first had its generation aborted in the engine
    assert orl.aborted and set(orl.aborted) <= {"abort"}


def test_ungated_group_runs_to_the_step_limit(ungated_run):
    executor, orl, responses = ungated_run
    assert executor.groups_cut == 0 and not orl.aborted
    for r in responses:
        assert r["extra_logs"]["sr_gate_cut"] == 0.0
        assert len(r["action_ranges"]) == 3 or r["extra_logs"]["won"] == 1.0
        # the trajectory is one token sequence: every reply sits inside it
        assert all(0 < s <= e <= len(r["observation_tokens"]) for s, e in r["action_ranges"])


def _shim_vllm(monkeypatch) -> None:
    """Just enough of vllm for OpenRLHF's samples_generator module to import on CPU."""
    try:
        import vllm

        return
    except ImportError:
        pass
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SimpleNamespace
    vllm.__version__ = "0.29.0"
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    utils = types.ModuleType("vllm.utils")
    utils.random_uuid = lambda: "0"
    for name, mod in (("vllm", vllm), ("vllm.inputs", inputs), ("vllm.utils", utils)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_openrlhf_dynamic_filtering_drops_a_cut_group_and_refills(
    cut_run, ungated_run, game, ray_cluster, monkeypatch
):
    import copy

    import ray

    _shim_vllm(monkeypatch)
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    cut = cut_run[2]
    kept = copy.deepcopy(ungated_run[2])
    kept[0]["scores"], kept[1]["scores"] = 0.0, 1.0  # an informative group: rewards differ

    batches = [cut, kept]
    gen = SamplesGenerator.__new__(SamplesGenerator)
    gen.args = SimpleNamespace(algo=SimpleNamespace(dynamic_filtering_range=(0.0, 1.0)))
    gen._dispatch_prompts_to_vllm = lambda prompts, labels, images=None, **kw: [ray.put(batches.pop(0))]
    prompts = iter([(None, ["p0"], [str(game)], [None]), (None, ["p1"], [str(game)], [None])])

    accepted, consumed, _ = gen._generate_vllm(prompts, num_prompts=1, dynamic_filtering=True, max_len=4096)
    assert consumed == 2  # the cut group was filtered and a replacement prompt dispatched
    assert [e.scores[0].item() for e in accepted] == [0.0, 1.0]
