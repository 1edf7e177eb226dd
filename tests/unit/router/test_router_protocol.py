"""What the router reads of a request body."""

from __future__ import annotations

import pytest

from kvscale_router.protocol import BadRequest, parse_body


def test_prompts_in_every_shape() -> None:
    assert parse_body(b'{"prompt": "hi", "max_tokens": 4}').prompt_view == "hi"
    assert parse_body(b'{"prompt": [1, 2, 3]}').prompt_view == [1, 2, 3]
    assert parse_body(b'{"prompt": [[4, 5]]}').prompt_view == [4, 5]
    assert parse_body(b'{"prompt": ["one"]}').prompt_view == "one"
    chat = parse_body(
        b'{"messages": [{"role": "system", "content": "S"},'
        b' {"role": "user", "content": [{"type": "text", "text": "U"}]}]}'
    )
    assert chat.prompt_view == "<|system|>S<|user|>U"


def test_cost_counts_prompt_and_requested_output() -> None:
    assert parse_body(b'{"prompt": [1, 2, 3], "max_tokens": 10, "n": 2}').cost_tokens == 23
    assert parse_body(b'{"prompt": "' + b"x" * 400 + b'"}').cost_tokens == 100 + 16
    chat = b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7}'
    assert parse_body(chat).cost_tokens == 7 + len("<|user|>hi") // 4


def test_unknown_fields_pass_through() -> None:
    assert parse_body(b'{"prompt": "x", "top_k": 3, "whatever": {}}').model_extra == {
        "top_k": 3,
        "whatever": {},
    }


@pytest.mark.parametrize(
    "body", [b"not json", b"[1]", b'{"prompt": 5}', b'{"stream": "yes please"}',
             b'{"max_tokens": 0}', b"\xff"],
)  # fmt: skip
def test_unroutable_bodies_are_bad_requests(body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_body(body)
