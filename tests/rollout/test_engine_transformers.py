"""The transformers engine on SmolLM2: the RolloutEngine contract, checked for real."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from selective_rollout.rollout.engines import (
    EngineError,
    SamplingParams,
    transformers_batch,
    transformers_sampler,
)
from selective_rollout.weight_sync.collective import TensorSpec, broadcast, make_sync_group

MSGS = [{"role": "user", "content": "Name three kitchen objects."}]


def run(coro):
    return asyncio.run(coro)


def teacher_forced(engine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Log-probs of ``completion`` after ``prompt`` from one plain forward pass."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + completion])).logits[0].float()
    lp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def prompt_ids(tokenizer, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"])


def test_generate_n_outputs_with_logprobs_of_a_teacher_forced_pass(hf_engine):
    c = run(hf_engine.generate("gen-n", MSGS, SamplingParams(n=2, max_tokens=8, seed=3)))
    ids = hf_engine._prompt_ids("x", MSGS)
    assert c.prompt_tokens == len(ids) and [o.index for o in c.outputs] == [0, 1]
    for o in c.outputs:
        assert o.finish_reason in ("stop", "length") and 0 < len(o.token_ids) <= 8
        assert len(o.logprobs) == len(o.token_ids)
        assert o.text == hf_engine.tokenizer.decode(o.token_ids, skip_special_tokens=True)
        if o.finish_reason == "stop":
            assert o.token_ids[-1] == hf_engine.eot_id
        torch.testing.assert_close(
            torch.tensor(o.logprobs), teacher_forced(hf_engine, ids, o.token_ids), atol=2e-4, rtol=0
        )


def test_score_is_the_teacher_forced_log_prob_of_every_token_after_the_first(hf_engine, smollm2_tokenizer):
    ids = prompt_ids(smollm2_tokenizer, "Put a clean apple in the fridge.")
    scored = run(hf_engine.score(ids))
    assert len(scored) == len(ids) - 1
    torch.testing.assert_close(
        torch.tensor(scored), teacher_forced(hf_engine, ids[:1], ids[1:]), atol=2e-4, rtol=0
    )


def test_concurrent_requests_of_different_lengths_batch_correctly(hf_engine, smollm2_tokenizer):
    """Left-padded batching must not change any request's log-probs."""
    texts = ["Hi.", "Describe a cabinet in a long and detailed sentence, please.", "What is 2+2?"]
    prompts = [prompt_ids(smollm2_tokenizer, t) for t in texts]

    async def go():
        sp = SamplingParams(max_tokens=6, seed=5)
        return await asyncio.gather(*(hf_engine.generate(f"b{i}", p, sp) for i, p in enumerate(prompts)))

    for p, c in zip(prompts, run(go()), strict=True):
        for o in c.outputs:
            ref = teacher_forced(hf_engine, p, o.token_ids)
            torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=2e-4, rtol=0)


def test_same_seed_same_tokens(hf_engine):
    sp = SamplingParams(n=2, max_tokens=8, seed=11)
    a = run(hf_engine.generate("seed-a", MSGS, sp))
    b = run(hf_engine.generate("seed-b", MSGS, sp))
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]


def test_session_prefills_only_the_new_suffix(hf_engine, smollm2_tokenizer):
    p1 = prompt_ids(smollm2_tokenizer, "You are in a kitchen. What do you do?")
    sp = SamplingParams(max_tokens=6, seed=1)
    c1 = run(hf_engine.generate("sess-1", p1, sp, session_id="traj-A"))
    suffix = smollm2_tokenizer(
        "\n<|im_start|>user\nNothing happens.<|im_end|>\n<|im_start|>assistant\n"
    ).input_ids
    p2 = p1 + c1.outputs[0].token_ids + suffix
    c2 = run(hf_engine.generate("sess-2", p2, sp, session_id="traj-A"))
    assert c2.cached_prompt_tokens == len(p1) + len(c1.outputs[0].token_ids) - 1
    ref = teacher_forced(hf_engine, p2, c2.outputs[0].token_ids)
    torch.testing.assert_close(torch.tensor(c2.outputs[0].logprobs), ref, atol=2e-4, rtol=0)
    run(hf_engine.release(["traj-A"]))


def test_group_siblings_share_the_prompt_prefill(hf_engine, smollm2_tokenizer):
    p = prompt_ids(smollm2_tokenizer, "A shared group prompt about a fridge.")
    sp = SamplingParams(max_tokens=3, seed=2)
    first = run(hf_engine.generate("g-0", p, sp, session_id="grp-t0"))
    second = run(hf_engine.generate("g-1", p, sp, session_id="grp-t1"))
    assert first.cached_prompt_tokens < len(p) - 1
    assert second.cached_prompt_tokens == len(p) - 1
    run(hf_engine.release(["grp-t0", "grp-t1"]))
    assert "grp-t0" not in hf_engine._store._entries


def test_reset_cache_makes_the_next_request_prefill_its_whole_prompt(hf_engine, smollm2_tokenizer):
    p = prompt_ids(smollm2_tokenizer, "A prompt a benchmark arm plays twice.")
    sp = SamplingParams(max_tokens=3, seed=4)
    run(hf_engine.generate("r-0", p, sp, session_id="arm-a"))
    assert run(hf_engine.generate("r-1", p, sp, session_id="arm-b")).cached_prompt_tokens == len(p) - 1
    run(hf_engine.reset_cache())
    assert run(hf_engine.generate("r-2", p, sp, session_id="arm-c")).cached_prompt_tokens == 0
    run(hf_engine.release(["arm-a", "arm-b", "arm-c"]))


def test_constrained_choice_emits_one_choice_and_unconstrained_logprobs(hf_engine):
    choices = ["go to cabinet 1", "go to cabinet 10", "open fridge 1", "look"]
    ids = hf_engine._prompt_ids("x", MSGS)
    c = run(hf_engine.generate("choice", MSGS, SamplingParams(n=3, max_tokens=20, seed=0, choices=choices)))
    for o in c.outputs:
        assert o.text in choices and o.finish_reason == "stop" and o.token_ids[-1] == hf_engine.eot_id
        torch.testing.assert_close(
            torch.tensor(o.logprobs), teacher_forced(hf_engine, ids, o.token_ids), atol=2e-4, rtol=0
        )


def test_constrained_choice_tells_prefix_choices_apart(hf_engine):
    """Each choice is closed by end-of-turn, so both '... 1' and '... 10' stay reachable and exact."""
    choices = ["go to cabinet 1", "go to cabinet 10"]
    c = run(
        hf_engine.generate(
            "pre", MSGS, SamplingParams(n=24, max_tokens=20, seed=4, temperature=3.0, choices=choices)
        )
    )
    assert {o.text for o in c.outputs} == set(choices)


def test_forced_runs_are_fed_in_one_forward_with_the_logprobs_of_token_by_token(hf_engine, monkeypatch):
    """Where a choice leaves one legal token the engine takes it unsampled and feeds the run at
    once: the same outputs for the same seed as one token per forward, far fewer forwards, and the
    log-probs of a teacher-forced pass."""
    choices = ["take the red apple 1 from the countertop 2", "look"]
    ids = hf_engine._prompt_ids("x", MSGS)

    def play(tag: str) -> tuple[list, int]:
        before = run(hf_engine.health())["decode_forwards"]
        sp = SamplingParams(n=4, max_tokens=30, seed=8, temperature=2.0, choices=choices)
        c = run(hf_engine.generate(tag, MSGS, sp))
        return c.outputs, run(hf_engine.health())["decode_forwards"] - before

    chunked, chunked_forwards = play("jump")
    monkeypatch.setattr(hf_engine.params, "decode_chunk_tokens", 1)
    stepped, stepped_forwards = play("step")
    assert [o.token_ids for o in chunked] == [o.token_ids for o in stepped]
    assert {o.text for o in chunked} == set(choices)  # both branches taken, then forced
    longest = max(len(o.token_ids) for o in chunked)
    assert stepped_forwards == longest - 1 and chunked_forwards <= 2 < longest - 1
    for a, b in zip(chunked, stepped, strict=True):
        assert a.finish_reason == b.finish_reason == "stop"
        ref = teacher_forced(hf_engine, ids, a.token_ids)
        torch.testing.assert_close(torch.tensor(a.logprobs), ref, atol=2e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(b.logprobs), ref, atol=2e-4, rtol=0)


def test_a_session_after_chunked_decoding_reuses_exact_kv(hf_engine, smollm2_tokenizer):
    """Rows fed runs of different lengths in one forward leave masked padding inside the batch's
    KV; what a session keeps is its own tokens only, so its next turn scores as a fresh pass."""
    p1 = prompt_ids(smollm2_tokenizer, "You are in a kitchen. What do you do?")
    p2 = prompt_ids(smollm2_tokenizer, "You are in a garden. Say something short.")
    long_choice = ["open the fridge 1 and then look at it closely", "go to the fridge 1"]

    async def first_turn():
        return await asyncio.gather(
            hf_engine.generate(
                "h-a", p1, SamplingParams(max_tokens=30, seed=1, choices=long_choice), "hole-a"
            ),
            hf_engine.generate("h-b", p2, SamplingParams(max_tokens=6, seed=1), "hole-b"),
        )

    suffix = smollm2_tokenizer(
        "\n<|im_start|>user\nNothing happens.<|im_end|>\n<|im_start|>assistant\n"
    ).input_ids
    for prompt, c, sid in zip((p1, p2), run(first_turn()), ("hole-a", "hole-b"), strict=True):
        # "hole-b" decodes on after "hole-a" retires, over a KV whose hole columns were dropped
        first = teacher_forced(hf_engine, prompt, c.outputs[0].token_ids)
        torch.testing.assert_close(torch.tensor(c.outputs[0].logprobs), first, atol=2e-4, rtol=0)
        follow = prompt + c.outputs[0].token_ids + suffix
        c2 = run(hf_engine.generate(f"{sid}-2", follow, SamplingParams(max_tokens=5, seed=2), session_id=sid))
        assert c2.cached_prompt_tokens == len(prompt) + len(c.outputs[0].token_ids) - 1
        ref = teacher_forced(hf_engine, follow, c2.outputs[0].token_ids)
        torch.testing.assert_close(torch.tensor(c2.outputs[0].logprobs), ref, atol=2e-4, rtol=0)
    run(hf_engine.release(["hole-a", "hole-b"]))


def test_retiring_a_row_drops_the_columns_no_kept_row_attends_to():
    """A decode forward as wide as one row's forced run leaves padding columns in the others' KV;
    once that row is gone nobody attends to them, so ``keep`` drops them with the left padding."""
    mask = torch.tensor(
        [
            [0, 1, 1, 1, 1, 1, 1, 1],  # the row that fed a run of 4 (columns 3-6), then 1
            [0, 0, 1, 1, 0, 0, 0, 1],  # fed 1 token in each of those forwards
            [0, 1, 1, 1, 0, 0, 0, 1],
        ]
    )
    batch = transformers_batch.DecodeBatch()
    batch.rows = ["wide", "b", "c"]
    kv = torch.arange(3 * 8, dtype=torch.float).reshape(3, 1, 8, 1)
    batch.set_kv([(kv, -kv)])
    batch.mask = mask
    batch.keep([1, 2])
    assert batch.rows == ["b", "c"]
    assert batch.mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    keys, values = batch.kv[0]
    assert keys[:, 0, :, 0].tolist() == [[9, 10, 11, 15], [17, 18, 19, 23]]
    torch.testing.assert_close(values, -keys)
    assert [k.tolist() for k, _ in batch.row_kv(0)] == [[[[[10.0], [11.0], [15.0]]]]]


def test_a_stream_aborted_inside_a_forced_run_adds_up_to_its_completion(hf_engine):
    """Forced tokens are streamed once scored, so an output aborted before its forced run was fed
    streamed exactly what its completion holds (token ids and log-probs of equal length)."""
    forced = ["go " * 200]

    async def go():
        deltas, completion = [], None
        stream = hf_engine.stream("fstream", MSGS, SamplingParams(max_tokens=400, choices=forced))
        async for item in stream:
            if hasattr(item, "outputs"):
                completion = item
            else:
                deltas.append(item.text)
                if len(deltas) == 2:
                    await hf_engine.abort(["fstream"])
        return deltas, completion

    deltas, c = run(go())
    out = c.outputs[0]
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 200
    assert len(out.logprobs) == len(out.token_ids) and "".join(deltas) == out.text


def test_abort_ends_a_running_request_at_once(hf_engine):
    long_choice = ["go " * 400]  # forces ~400 tokens without an end-of-turn

    async def go():
        task = asyncio.create_task(
            hf_engine.generate("long", MSGS, SamplingParams(max_tokens=1000, choices=long_choice))
        )
        while not hf_engine._scheduler.batch.rows:
            await asyncio.sleep(0.01)
        await hf_engine.abort(["long", "not-a-request"])
        return await asyncio.wait_for(task, timeout=60)

    c = run(go())
    out = c.outputs[0]
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 400
    assert len(out.logprobs) == len(out.token_ids)


def test_abort_before_admission_returns_abort(hf_engine):
    async def go():
        task = asyncio.create_task(hf_engine.generate("early", MSGS, SamplingParams(n=2, max_tokens=4)))
        await asyncio.sleep(0)
        await hf_engine.abort(["early"])
        return await task

    c = run(go())
    assert [o.finish_reason for o in c.outputs] == ["abort", "abort"]


def test_load_weights_changes_outputs_and_checksum(hf_engine):
    sp = SamplingParams(max_tokens=8, temperature=0.0)
    name = "model.layers.0.mlp.down_proj.weight"
    original = dict(hf_engine.model.named_parameters())[name].detach().clone()
    before_sum = run(hf_engine.weights_checksum())
    before = run(hf_engine.generate("w0", MSGS, sp)).outputs[0].token_ids
    try:
        noisy = original + torch.randn(original.shape, generator=torch.Generator().manual_seed(0)) * 0.5
        run(hf_engine.load_weights({name: noisy}, 1))
        assert run(hf_engine.weights_checksum()) != pytest.approx(before_sum)
        assert run(hf_engine.generate("w1", MSGS, sp)).outputs[0].token_ids != before
    finally:
        run(hf_engine.load_weights({name: original}, 0))
    assert run(hf_engine.weights_checksum()) == pytest.approx(before_sum)
    assert run(hf_engine.generate("w2", MSGS, sp)).outputs[0].token_ids == before


def scored_tokens(engine, request_id: str) -> int:
    """Tokens of the first output of a request in flight that the engine has scored so far."""
    req = engine._scheduler.requests.get(request_id)
    return len(req.seqs[0].logprobs) if req is not None and req.seqs else 0


def test_weights_loaded_mid_reply_reach_it_and_its_tokens_keep_the_version_of_their_kv(hf_engine):
    """A weight update does not wait for the replies in flight: it lands between two decode
    steps and the reply goes on under the new weights (its later log-probs are theirs), over the
    KV the old weights computed, so every token keeps the version of the reply's admission."""
    long_choice = ["go " * 400]  # forces ~400 tokens without an end-of-turn: the reply is long
    sampling = SamplingParams(max_tokens=1000, choices=long_choice)
    name = "model.norm.weight"
    original = dict(hf_engine.model.named_parameters())[name].detach().clone()
    old = run(hf_engine.health())["weights_version"]
    baseline = run(hf_engine.generate("unspanned", MSGS, sampling)).outputs[0]

    async def go():
        task = asyncio.create_task(hf_engine.generate("span", MSGS, sampling))
        while scored_tokens(hf_engine, "span") < 3:
            await asyncio.sleep(0.005)
        await hf_engine.load_weights({name: original * 1.5}, old + 7)
        return await asyncio.wait_for(task, timeout=120)

    try:
        out = run(go()).outputs[0]
        assert run(hf_engine.health())["weights_version"] == old + 7
        after = run(hf_engine.generate("after", MSGS, SamplingParams(max_tokens=2))).outputs[0]
    finally:
        run(hf_engine.load_weights({name: original}, old))
    assert out.finish_reason == "stop" and out.token_ids == baseline.token_ids
    assert out.versions == [old] * len(out.token_ids)
    assert out.logprobs[:3] == pytest.approx(baseline.logprobs[:3], abs=1e-5)  # before the load
    assert out.logprobs[-1] != pytest.approx(baseline.logprobs[-1], abs=1e-3)  # after it: new weights
    assert after.versions == [old + 7] * len(after.token_ids)  # admitted after the load


def test_load_weights_rejects_unknown_names_and_shapes(hf_engine):
    with pytest.raises(KeyError, match="not_a_param"):
        run(hf_engine.load_weights({"not_a_param": torch.zeros(1)}, 1))
    with pytest.raises(ValueError, match="shape"):
        run(hf_engine.load_weights({"model.norm.weight": torch.zeros(3)}, 1))


def test_receive_weights_over_a_gloo_sync_group(hf_engine):
    """The learner (rank 0, a thread here) broadcasts; the engine (rank 1) loads by HF name."""
    name = "model.norm.weight"
    param = dict(hf_engine.model.named_parameters())[name]
    original = param.detach().clone()
    new = torch.full_like(original, 0.5)
    port = 29000 + (threading.get_ident() % 1000)

    def learner():
        group = make_sync_group("gloo", "127.0.0.1", port, 0, 2)
        broadcast(group, new.clone())

    thread = threading.Thread(target=learner)
    thread.start()
    try:
        run(hf_engine.init_weight_sync("127.0.0.1", port, 1, 2, "gloo"))
        run(hf_engine.receive_weights([TensorSpec.of(name, new)], 1))
        thread.join(timeout=60)
        assert torch.equal(param.detach(), new)
    finally:
        run(hf_engine.load_weights({name: original}, 0))


@pytest.mark.parametrize(
    "bad",
    [
        SamplingParams(n=0),
        SamplingParams(max_tokens=0),
        SamplingParams(top_p=0.0),
        SamplingParams(choices=[]),
        SamplingParams(temperature=float("nan")),
        SamplingParams(temperature=1e-45),  # logits / T overflows: a NaN softmax in the batch
        SamplingParams(top_p=float("nan")),
        SamplingParams(seed=2**64),
        SamplingParams(seed=-1),
        SamplingParams(n=True),
    ],
)
def test_bad_sampling_params_are_rejected(hf_engine, bad):
    with pytest.raises(ValueError, match="SamplingParams"):
        run(hf_engine.generate("bad", MSGS, bad))


def test_bad_prompts_are_rejected(hf_engine):
    with pytest.raises(EngineError, match="empty prompt"):
        run(hf_engine.generate("e", [], SamplingParams()))
    with pytest.raises(EngineError, match="outside"):
        run(hf_engine.generate("o", [10**7], SamplingParams()))


def test_a_prompt_over_the_context_is_refused_before_any_prefill(hf_engine):
    context = hf_engine.model.config.max_position_embeddings
    before = run(hf_engine.health())["prefilled_tokens"]
    with pytest.raises(EngineError, match=rf"exceed the model's context of {context} tokens"):
        run(hf_engine.generate("long", [1] * context, SamplingParams(max_tokens=4)))
    assert run(hf_engine.health())["prefilled_tokens"] == before


def test_a_request_failing_at_admission_leaves_its_neighbours_alone(hf_engine, monkeypatch):
    finish = hf_engine._scheduler._finish

    def finish_or_fail(item):
        if item.req.request_id == "poison":
            raise RuntimeError("a sampler failure of this request only")
        return finish(item)

    monkeypatch.setattr(hf_engine._scheduler, "_finish", finish_or_fail)

    async def go():
        sp = SamplingParams(max_tokens=4, seed=1)
        return await asyncio.wait_for(
            asyncio.gather(
                hf_engine.generate("poison", MSGS, sp),
                hf_engine.generate("neighbour", MSGS, sp),
                return_exceptions=True,
            ),
            timeout=120,
        )

    poison, neighbour = run(go())
    assert isinstance(poison, EngineError) and "poison failed" in str(poison)
    assert neighbour.outputs[0].finish_reason in ("stop", "length")


def test_a_failed_step_answers_every_request_even_those_being_admitted(hf_engine, monkeypatch):
    def broken_add(self, groups):  # fails after the requests left the queue, before the batch
        raise RuntimeError("out of memory")

    monkeypatch.setattr(transformers_batch.DecodeBatch, "add", broken_add)

    async def go():
        sp = SamplingParams(max_tokens=4, seed=1)
        calls = (hf_engine.generate(f"adm{i}", MSGS, sp) for i in range(3))
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=120)

    results = run(go())
    assert all(isinstance(r, EngineError) and "engine step failed" in str(r) for r in results), results


def test_health_reports_cache_and_work(hf_engine):
    h = run(hf_engine.health())
    assert h["backend"] == "transformers" and h["alive"] and h["generated_tokens"] > 0
    assert 0 < h["busy_s"] <= h["uptime_s"] and h["prefill_forwards"] > 0


def _items(engine, prompts: list[list[int]], sessions: list[str | None]):
    """Requests as the engine admits them (outputs made, cached prefix looked up)."""
    from selective_rollout.rollout.engines.transformers_request import Request

    loop = asyncio.new_event_loop()
    reqs = [
        Request(f"direct-{i}", p, SamplingParams(max_tokens=2), sid, loop.create_future(), None)
        for i, (p, sid) in enumerate(zip(prompts, sessions, strict=True))
    ]
    loop.close()
    return [engine._scheduler._prepare(r) for r in reqs]


def test_batched_prefill_gives_the_logits_and_kv_of_one_at_a_time(hf_engine, smollm2_tokenizer):
    """Four prompts, two of them extending a cached session, two reusing only the chat
    template's opening from the store (three cached lengths), of different suffix lengths: one
    padded forward gives each the last-token logits and prompt KV that its own forward gives."""
    base = prompt_ids(smollm2_tokenizer, "You are in a kitchen. There is a fridge and a drawer.")
    run(hf_engine.generate("pf-seed-a", base, SamplingParams(max_tokens=4, seed=1), session_id="pf-a"))
    run(hf_engine.generate("pf-seed-b", base[:-6], SamplingParams(max_tokens=4, seed=1), session_id="pf-b"))
    prompts = [
        base + smollm2_tokenizer(" Nothing happens. Go on.").input_ids,
        base[:-6] + smollm2_tokenizer(" You open the drawer 1. It is empty, sadly.").input_ids,
        prompt_ids(smollm2_tokenizer, "Where is the apple?"),
        prompt_ids(smollm2_tokenizer, "Put a clean mug in the coffee machine, then look around."),
    ]
    sessions = ["pf-a", "pf-b", None, None]
    with torch.inference_mode():
        batched = _items(hf_engine, prompts, sessions)
        assert batched[0].cached > batched[1].cached > max(batched[2].cached, batched[3].cached)
        assert len({it.cached for it in batched}) >= 3 and len({len(it.suffix) for it in batched}) == 4
        forwards = hf_engine._runner.stats["prefill_forwards"]
        hf_engine._runner.prefill(batched)
        assert hf_engine._runner.stats["prefill_forwards"] == forwards + 1
        for item, alone in zip(batched, _items(hf_engine, prompts, sessions), strict=True):
            hf_engine._runner.prefill([alone])
            torch.testing.assert_close(item.logits, alone.logits, atol=1e-4, rtol=0)
            assert len(item.prompt_kv) == len(alone.prompt_kv)
            for (k, v), (k1, v1) in zip(item.prompt_kv, alone.prompt_kv, strict=True):
                assert k.shape == k1.shape == (1, k.shape[1], len(item.req.prompt), k.shape[3])
                torch.testing.assert_close(k, k1, atol=1e-4, rtol=0)
                torch.testing.assert_close(v, v1, atol=1e-4, rtol=0)
    run(hf_engine.release(["pf-a", "pf-b"]))


def test_requests_arriving_together_are_prefilled_in_one_forward(hf_engine, smollm2_tokenizer):
    """Next turns of four trajectories (similar suffixes) queued together: one prefill forward,
    and every log-prob still that of a teacher-forced pass."""
    turn1 = [
        prompt_ids(smollm2_tokenizer, f"Room {i}: you see a cabinet {i} and a shelf {i}.") for i in range(4)
    ]
    for i, p in enumerate(turn1):
        run(hf_engine.generate(f"t1-{i}", p, SamplingParams(max_tokens=3, seed=i), session_id=f"traj-{i}"))
    turn2 = [
        p + smollm2_tokenizer(f" You arrive at shelf {i}. On it you see nothing.").input_ids
        for i, p in enumerate(turn1)
    ]
    before = dict(hf_engine._runner.stats)

    async def go():
        calls = [
            hf_engine.generate(f"t2-{i}", p, SamplingParams(max_tokens=4, seed=i), session_id=f"traj-{i}")
            for i, p in enumerate(turn2)
        ]
        return await asyncio.gather(*calls)

    done = run(go())
    assert hf_engine._runner.stats["prefill_forwards"] - before["prefill_forwards"] == 1
    assert all(c.cached_prompt_tokens > 0 for c in done)
    for p, c in zip(turn2, done, strict=True):
        ref = teacher_forced(hf_engine, p, c.outputs[0].token_ids)
        torch.testing.assert_close(torch.tensor(c.outputs[0].logprobs), ref, atol=2e-4, rtol=0)
    run(hf_engine.release([f"traj-{i}" for i in range(4)]))


def test_siblings_arriving_together_prefill_their_shared_prompt_once(hf_engine, smollm2_tokenizer):
    """A group's first turn: G requests with one prompt and their own sessions, all queued at
    once. The first is prefilled; the others wait one wave and reuse it (one token each)."""
    p = prompt_ids(smollm2_tokenizer, "A group prompt about a microwave, a sink basin and a toaster.")
    before = dict(hf_engine._runner.stats)

    async def go():
        sp = SamplingParams(max_tokens=2, seed=4)
        return await asyncio.gather(
            *(hf_engine.generate(f"sib-{i}", p, sp, session_id=f"sib-t{i}") for i in range(4))
        )

    done = run(go())
    assert hf_engine._runner.stats["prefilled_tokens"] - before["prefilled_tokens"] == len(p) + 3
    assert hf_engine._runner.stats["prefill_forwards"] - before["prefill_forwards"] == 2
    assert sorted(c.cached_prompt_tokens for c in done) == [0, len(p) - 1, len(p) - 1, len(p) - 1]
    run(hf_engine.release([f"sib-t{i}" for i in range(4)]))


def test_a_request_that_breaks_the_batched_prefill_fails_alone(hf_engine, monkeypatch):
    prefill = hf_engine._runner.prefill

    def prefill_or_fail(items):
        if any(it.req.request_id == "breaks" for it in items):
            raise RuntimeError("a forward this request breaks")
        return prefill(items)

    monkeypatch.setattr(hf_engine._runner, "prefill", prefill_or_fail)

    async def go():
        sp = SamplingParams(max_tokens=3, seed=1)
        calls = [hf_engine.generate(rid, MSGS, sp) for rid in ("breaks", "ok-1", "ok-2")]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=120)

    breaks, *fine = run(go())
    assert isinstance(breaks, EngineError) and "breaks failed at prefill" in str(breaks)
    assert all(c.outputs[0].finish_reason in ("stop", "length") for c in fine)


def test_the_exponential_race_samples_exactly_and_keys_its_noise_by_token_id():
    """Each draw is a sample of ``probs``; and with the same generator seed a token meets the same
    noise whatever else the allowed list holds, so two nearly equal distributions over different
    lists pick alike (``torch.multinomial`` over the list's positions does not)."""
    race = transformers_sampler.exponential_race
    probs = torch.tensor([0.5, 0.3, 0.2])
    allowed = torch.tensor([7, 3, 11])
    picks = [race(probs, allowed, 16, torch.Generator().manual_seed(s)) for s in range(4000)]
    counts = torch.bincount(torch.tensor(picks), minlength=3) / len(picks)
    assert torch.allclose(counts, probs, atol=0.03)

    # the same tokens, listed in another order and beside a token of tiny probability
    other_allowed = torch.tensor([2, 11, 7, 3])
    other_probs = torch.tensor([0.001, 0.2, 0.5, 0.3])
    same = by_position = 0
    for s in range(500):
        token = int(allowed[race(probs, allowed, 16, torch.Generator().manual_seed(s))])
        other = int(other_allowed[race(other_probs, other_allowed, 16, torch.Generator().manual_seed(s))])
        same += token == other
        a = int(allowed[torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(s))])
        b = other_allowed[torch.multinomial(other_probs, 1, generator=torch.Generator().manual_seed(s))]
        by_position += a == int(b)
    assert same >= 495 and by_position < 400
