"""The wire models: what is accepted, what is refused, and how chunks are framed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale_engine.server.metrics import build_1_2_5_buckets
from kvscale_engine.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionRequest,
    UsageInfo,
    error_body,
    sse,
)


def test_completion_defaults_follow_openai() -> None:
    req = CompletionRequest.model_validate_json('{"model": "m", "prompt": "hi"}')
    assert (req.max_tokens, req.temperature, req.top_p, req.n, req.stream) == (
        16,
        1.0,
        1.0,
        1,
        False,
    )
    assert req.single_prompt == "hi" and req.stop_list == [] and not req.include_usage


@pytest.mark.parametrize(
    ("prompt", "single"),
    [("text", "text"), ([1, 2, 3], [1, 2, 3]), (["one"], "one"), ([[4, 5]], [4, 5])],
)
def test_prompt_forms(prompt: Any, single: Any) -> None:
    assert CompletionRequest(prompt=prompt).single_prompt == single


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": 0},
        {"prompt": "x", "temperature": -0.1},
        {"prompt": "x", "temperature": "warm"},
        {"prompt": "x", "top_p": 0},
        {"prompt": "x", "n": 0},
        {"prompt": "x", "unknown": 1},
        {"prompt": "x", "stop": ""},
        {"prompt": "x", "stop": ["a"] * 5},
        {"prompt": "x", "presence_penalty": 0.5},
        {"prompt": "x", "logprobs": 3},
        {"prompt": "x", "echo": True},
        {"prompt": []},
        {"prompt": ["a", "b"]},
        {"prompt": [-1]},
        {"prompt": "x", "stream_options": {"include_usage": True, "extra": 1}},
    ],
)
def test_bad_completion_requests_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate_json(json.dumps(body))


def test_chat_request_text_parts_and_token_limit_alias() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "Hi "}, {"type": "text", "text": "there"},
                ]},
            ],
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )  # fmt: skip
    assert req.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    assert req.max_tokens == 7 and req.include_usage and req.max_tokens is not None


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
    ],
)
def test_bad_chat_requests_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(body)


def test_sse_framing_and_usage_only_when_asked() -> None:
    chunk = ChatCompletionChunk(
        id="c", created=1, model="m",
        choices=[ChatChunkChoice(index=0, delta={"content": "hi"})],
    )  # fmt: skip
    plain = sse(chunk, include_usage=False)
    assert plain.startswith(b"data: {") and plain.endswith(b"}\n\n")
    assert b"usage" not in plain
    body = json.loads(plain[len(b"data: ") :])
    assert body["choices"][0] == {
        "index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None,
    }  # fmt: skip
    assert json.loads(sse(chunk, include_usage=True)[6:])["usage"] is None
    chunk.usage = UsageInfo(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    assert json.loads(sse(chunk, include_usage=True)[6:])["usage"]["total_tokens"] == 3


def test_error_body_shape() -> None:
    assert error_body("bad", "invalid_request_error", param="n", code="x") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "x"}
    }


def test_vllm_token_buckets() -> None:
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(4096)[-3:] == (500, 1000, 2000)
