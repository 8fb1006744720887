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
