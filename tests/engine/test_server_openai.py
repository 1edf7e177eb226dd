"""The server through the official `openai` client: completions, chat, streaming, stop, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_fixtures import MODEL, LiveServer, live_server

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.tokenizer import Tokenizer
from kvscale_engine.sampling_params import SamplingParams

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(llama_dir, tmp_path_factory.mktemp("openai")) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def test_greedy_completion_matches_the_offline_engine(
    client: openai.OpenAI, llama_dir: Path
) -> None:
    engine = LLMEngine(EngineConfig(model=str(llama_dir), max_model_len=512, num_kv_blocks=64))
    prompt_ids = engine.tokenizer.encode(PROMPT)
    engine.add_request("0", prompt_ids, SamplingParams(temperature=0.0, max_tokens=20))
    offline = None
    while engine.has_unfinished_requests():
        offline = next((o for o in engine.step() if o.finished), offline)
    assert offline is not None

    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    choice = got.choices[0]
    assert choice.text == offline.text
    assert choice.finish_reason == offline.finish_reason
    assert got.usage is not None
    assert got.usage.prompt_tokens == len(prompt_ids)
    assert got.usage.completion_tokens == len(offline.output_token_ids)
    assert got.model == MODEL and got.object == "text_completion"


def test_token_id_prompt_equals_text_prompt(client: openai.OpenAI, llama_dir: Path) -> None:
    ids = Tokenizer.from_dir(llama_dir).encode(PROMPT)
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)


def test_chat_completion(client: openai.OpenAI) -> None:
    got = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=12,
        temperature=0,
    )
    assert got.object == "chat.completion"
    message = got.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert got.choices[0].finish_reason in ("stop", "length")
    assert got.usage is not None and got.usage.completion_tokens >= 1


def test_streamed_chat_equals_unstreamed_and_reports_usage(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about KV caches"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_is_server_sent_events_ending_in_done(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.api}/completions", json=body, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(resp.iter_raw())
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert b'"usage"' not in raw  # only with stream_options.include_usage


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "the tiny model's greedy text should have a usable middle"
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop]
    )
    assert got.choices[0].finish_reason == "stop"
    assert got.choices[0].text == text[: text.index(stop)]


def test_n_choices_and_seeded_sampling_repeat(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "top_p": 0.9,
        "n": 3, "seed": 1234,
    }  # fmt: skip
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert len({c.text for c in first.choices}) > 1, "choices should be sampled independently"
    assert first.usage is not None and first.usage.completion_tokens >= 3


def test_models_health_and_ready(client: openai.OpenAI, server: LiveServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ready = httpx.get(f"{server.url}/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True


BAD_COMPLETIONS: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("max_tokens zero", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("unknown field", {"prompt": "x", "frobnicate": True}, 400, "frobnicate"),
    ("bad type", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("prompt missing", {"max_tokens": 3}, 400, "prompt"),
    ("prompt too long", {"prompt": "fox " * 600}, 400, "prompt"),
    ("prompt plus output too long", {"prompt": "x", "max_tokens": 600}, 400, "max_tokens"),
    ("token id out of vocab", {"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("empty token list", {"prompt": []}, 400, "prompt"),
    ("too many stops", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("batched prompts", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("unknown model", {"prompt": "x", "model": "gpt-17"}, 404, "model"),
]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [case[1:] for case in BAD_COMPLETIONS],
    ids=[case[0] for case in BAD_COMPLETIONS],
)
def test_bad_input_gets_an_openai_error(
    server: LiveServer, body: dict[str, Any], status: int, param: str | None
) -> None:
    resp = httpx.post(f"{server.api}/completions", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["message"] and error["type"]
    assert error["param"] == param or (error["param"] or "").startswith(str(param))


def test_bad_input_through_the_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert bad.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])


def test_malformed_and_oversize_bodies(server: LiveServer) -> None:
    url = f"{server.api}/completions"
    not_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and "JSON" in not_json.json()["error"]["message"]
    array = httpx.post(url, json=[1, 2, 3])
    assert array.status_code == 400 and array.json()["error"]["type"] == "invalid_request_error"
    huge = httpx.post(url, content=b'{"prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}')
    assert huge.status_code == 413 and huge.json()["error"]["message"]
    missing = httpx.get(f"{server.url}/v1/nothing-here")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong_method = httpx.get(url)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    # and the server is still fine
    ok = httpx.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200
