"""The few request fields the router reads, and OpenAI-style error bodies.

The router forwards the client's body byte for byte; it parses it only to learn what routing
needs (the prompt's first blocks, whether it streams, how many tokens it may cost). The engine
validates everything else, so unknown fields pass through untouched.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TEXT_CHARS_PER_TOKEN = 4  # a rough, tokenizer-free estimate for text prompts
DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default
CHAT_MAX_TOKENS_GUESS = 256  # chat has no default; a typical answer, only for load accounting
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class BadRequest(ValueError):
    """The body cannot be routed: not JSON, or a field the router reads has the wrong type."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = ""
    content: str | list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content)
        return self.content or ""


class RoutedRequest(BaseModel):
    """What the router reads of /v1/completions and /v1/chat/completions bodies."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    messages: list[_Message] | None = None
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)

    @property
    def prompt_view(self) -> str | list[int]:
        """The prompt as one text or one token-id list (chat messages joined in order)."""
        if self.messages is not None:
            return "".join(f"<|{m.role}|>{m.text}" for m in self.messages)
        value = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            value = value[0]  # a one-element batch
        if isinstance(value, str):
            return value
        return [int(t) for t in cast(list[int], value or [])]

    @property
    def cost_tokens(self) -> int:
        """Prompt plus the most output it may ask for: the KV it can occupy, roughly."""
        view = self.prompt_view
        prompt = len(view) if isinstance(view, list) else len(view) // TEXT_CHARS_PER_TOKEN
        return prompt + self.output_tokens

    @property
    def output_tokens(self) -> int:
        """The most output it may ask for, all choices together."""
        limit = self.max_completion_tokens or self.max_tokens
        if limit is None:
            limit = CHAT_MAX_TOKENS_GUESS if self.messages is not None else DEFAULT_MAX_TOKENS
        return limit * self.n


def parse_body(body: bytes) -> RoutedRequest:
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return RoutedRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"{where}: {first['msg']}") from exc


class OutputTally:
    """A response's output tokens, counted as it is relayed: the usage block's
    `completion_tokens` when it has one (every whole answer, and a stream asked for with
    `stream_options.include_usage`), else one per event of a stream, roughly one per token."""

    def __init__(self) -> None:
        self.events = 0
        self.tail = b""

    def feed(self, chunk: bytes) -> None:
        self.events += chunk.count(b"data: ")
        self.tail = (self.tail + chunk)[-2048:]

    @property
    def tokens(self) -> int | None:
        found = _COMPLETION_TOKENS.findall(self.tail)
        if found:
            return int(found[-1])
        return max(0, self.events - 1) if self.events else None  # the last event is [DONE]


def error_body(message: str, type_: str, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def sse_error(message: str, type_: str = "server_error") -> bytes:
    """An error reported in-band once a stream has started, as OpenAI does."""
    return b"data: " + json.dumps(error_body(message, type_)).encode() + b"\n\ndata: [DONE]\n\n"
