"""The OpenAI-compatible server over a real SmolLM2, on loopback, as a subprocess."""

from __future__ import annotations

import httpx
import pytest

from selective_rollout.integrations.serve import BadRequest, sampling_from_body, serve_subprocess


@pytest.fixture(scope="module")
def base_url(smollm2_path):
    with serve_subprocess(smollm2_path) as url:
        yield url


def test_models_and_a_chat_completion(base_url) -> None:
    with httpx.Client(base_url=base_url + "/", timeout=120) as c:
        assert [m["id"] for m in c.get("models").json()["data"]] == ["smollm2"]
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        body |= {"temperature": 0, "n": 2}
        r = c.post("chat/completions", json=body).json()
    assert [ch["index"] for ch in r["choices"]] == [0, 1]
    assert r["choices"][0]["message"]["content"] == r["choices"][1]["message"]["content"]  # greedy
    assert 1 <= r["usage"]["completion_tokens"] <= 8 and r["usage"]["prompt_tokens"] > 5


def test_bad_requests_get_one_clear_error(base_url) -> None:
    with httpx.Client(base_url=base_url + "/", timeout=60) as c:
        r = c.post("chat/completions", json={"messages": []})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
        r = c.post(
            "chat/completions", json={"model": "gpt-x", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 404 and "gpt-x" in r.json()["error"]["message"]


def test_sampling_fields_are_validated() -> None:
    with pytest.raises(BadRequest, match="temperature"):
        sampling_from_body({"temperature": -1})
    assert sampling_from_body({"max_completion_tokens": 7, "seed": 3}).max_tokens == 7
    with pytest.raises(BadRequest, match="max_tokens must be an integer >= 1, got 0"):
        sampling_from_body({"max_tokens": 0})  # once silently 64
    with pytest.raises(BadRequest, match=r"'n' must be an integer, got 1\.5"):
        sampling_from_body({"n": 1.5})
    # OpenAI's stop: one string or a list of them
    assert sampling_from_body({"stop": "\n"}).stop == ["\n"]
    assert sampling_from_body({"stop": ["Obs:", "\n\n"]}).stop == ["Obs:", "\n\n"]
    assert sampling_from_body({}).stop is None
    with pytest.raises(BadRequest, match="'stop' must be a non-empty string or a list of them"):
        sampling_from_body({"stop": ["", 3]})


# name -> (raw JSON fields after messages and "max_tokens": 4, the words the error must contain);
# raw text because json= cannot send NaN or a seed beyond 2**64; a later duplicate key wins.
LONG = "word " * 9000  # ~9,000 tokens on SmolLM2's 8,192-token context
POISON = {
    "temperature NaN": ('"temperature": NaN', "temperature"),
    "denormal temperature": ('"temperature": 1e-45', "temperature"),
    "seed of 2**64": ('"seed": 18446744073709551616', "seed"),
    "max_tokens 0": ('"max_tokens": 0', "max_tokens"),
    "n = 1000": ('"n": 1000', "at most 16"),
    "prompt over the context": (
        f'"messages": [{{"role": "user", "content": "{"word " * 9000}"}}]',
        "context",
    ),
}


def _raw_body(fields: str) -> str:
    return '{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, ' + fields + "}"


async def _poison_beside_a_good_request(base_url: str) -> tuple[dict, httpx.Response]:
    import asyncio

    good = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=base_url + "/", timeout=120) as c:
        bad = [c.post("chat/completions", content=_raw_body(f), headers=headers) for f, _ in POISON.values()]
        *answers, ok = await asyncio.gather(*bad, c.post("chat/completions", json=good))
    return dict(zip(POISON, answers, strict=True)), ok


def test_poison_pills_get_one_400_each_and_their_neighbour_is_served(base_url) -> None:
    import asyncio

    answers, ok = asyncio.run(_poison_beside_a_good_request(base_url))
    for name, response in answers.items():
        assert response.status_code == 400, (name, response.text)
        assert POISON[name][1] in response.json()["error"]["message"], (name, response.text)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_request_larger_than_the_admission_budget_gets_413(base_url) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 7000}], "n": 16, "max_tokens": 2048}
    with httpx.Client(base_url=base_url + "/", timeout=60) as c:
        r = c.post("chat/completions", json=body)
    assert r.status_code == 413 and "--max-admitted-tokens" in r.json()["error"]["message"]


# ---------------------------------------------------------------- streaming (stream=true)
GREEDY = {"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0}
GREEDY["max_tokens"] = 12


def _plain(base_url: str, **extra) -> dict:
    with httpx.Client(base_url=base_url + "/", timeout=120) as c:
        return c.post("chat/completions", json={**GREEDY, **extra}).json()


def test_the_openai_client_streams_what_a_plain_request_returns(base_url) -> None:
    """The official client, sync, n=2 greedy: per choice the deltas add up to the plain reply,
    each choice ends with its finish reason, and the usage chunk comes last and matches."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=120)
    chunks = list(
        client.chat.completions.create(
            model="smollm2", stream=True, n=2, stream_options={"include_usage": True}, **GREEDY
        )
    )
    plain = _plain(base_url, n=2)
    texts, finish = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        assert chunk.object == "chat.completion.chunk" and chunk.usage is None
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    assert [texts[i] for i in (0, 1)] == [ch["message"]["content"] for ch in plain["choices"]]
    assert texts[0] and finish == {i: ch["finish_reason"] for i, ch in enumerate(plain["choices"])}
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(exclude_none=True) == plain["usage"]
    assert len(chunks) > 4  # the text came in pieces, not as one


def test_the_async_openai_client_streams_without_a_usage_chunk(base_url) -> None:
    import asyncio

    import openai

    async def stream() -> list:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", timeout=120)
        return [c async for c in await client.chat.completions.create(model="smollm2", stream=True, **GREEDY)]

    chunks = asyncio.run(stream())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _plain(base_url)["choices"][0]["message"]["content"]
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_bad_stream_fields_get_one_400(base_url) -> None:
    with httpx.Client(base_url=base_url + "/", timeout=60) as c:
        for extra, words in [
            ({"stream": "yes"}, "'stream' must be true or false"),
            ({"stream_options": {"include_usage": True}}, "only allowed with stream=true"),
            ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
            ({"stream": True, "max_tokens": 0}, "max_tokens"),
        ]:
            r = c.post("chat/completions", json={**GREEDY, **extra})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (extra, r.text)


def test_a_client_that_leaves_mid_stream_aborts_its_generation(smollm2_path) -> None:
    """In process, so the engine can be looked at: httpx reads one event of a long stream and
    closes the connection; the server aborts the request (nothing left in the engine), and the
    next request is served."""
    import asyncio

    from selective_rollout.config.engine import EngineConfig
    from selective_rollout.integrations.serve import ChatServer, serve
    from selective_rollout.rollout.engines.transformers_engine import TransformersEngine

    async def scenario() -> tuple[int, int, int, int]:
        engine = TransformersEngine(EngineConfig(), smollm2_path)
        server = ChatServer(engine, "smollm2", engine.prompt_length)
        runner, port = await serve(server)
        long = {**GREEDY, "max_tokens": 2000, "stream": True}
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1/", timeout=120) as c:
                async with c.stream("POST", "chat/completions", json=long) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            break
                for _ in range(200):  # the server notices the closed connection
                    if server.aborted and not engine._scheduler.requests:
                        break
                    await asyncio.sleep(0.05)
                generated = (await engine.health())["generated_tokens"]
                after = await c.post("chat/completions", json=GREEDY)
                metrics = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
            assert "selective_rollout_requests_aborted_total 1.0" in metrics
            assert "selective_rollout_requests_finished_total 1.0" in metrics  # the one after
            return server.aborted, len(engine._scheduler.requests), generated, after.status_code
        finally:
            await runner.cleanup()
            await engine.shutdown()

    aborted, in_flight, generated, status = asyncio.run(scenario())
    assert (aborted, in_flight, status) == (1, 0, 200)
    assert generated < 2000  # the long reply was cut, not decoded to its end


def test_the_completions_endpoint_takes_token_ids_and_names_what_it_refuses(base_url) -> None:
    """A prompt of token ids is served (log-probs and ids on request); a text prompt, a stream, top
    log-probs and a malformed choice list are one 400 each."""
    with httpx.Client(base_url=base_url + "/", timeout=60) as c:
        body = {"prompt": [1, 9690, 198], "max_tokens": 3, "temperature": 0, "logprobs": 0}
        r = c.post("completions", json={**body, "return_token_ids": True}).json()
        (choice,) = r["choices"]
        assert r["object"] == "text_completion" and choice["token_ids"]
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        refused = {
            "prompt": ({**body, "prompt": "hi"}, "templates only chat messages"),
            "stream": ({**body, "stream": True}, "'stream' is served on /v1/chat/completions only"),
            "top log-probs": ({**body, "logprobs": 2}, "'logprobs' must be 0 or null"),
            "choices": ({**body, "structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        }
        for name, (bad, words) in refused.items():
            r = c.post("completions", json=bad)
            assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
