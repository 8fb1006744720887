"""The OpenAI-compatible server over a real SmolLM2, on loopback, as a subprocess."""

from __future__ import annotations

import httpx
import pytest

from selective_rollout.serve import BadRequest, sampling_from_body, serve_subprocess


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
