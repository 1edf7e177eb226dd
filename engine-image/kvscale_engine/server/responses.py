"""OpenAI response objects and server-sent event streams for one generation."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from kvscale_engine.server.generation import Generation
from kvscale_engine.server.protocol import (
    SSE_DONE,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionResponse,
    UsageInfo,
    error_body,
    new_id,
    now_s,
    sse,
)

log = logging.getLogger(__name__)


async def collect(gen: Generation, fmt: Formatter) -> None:
    async for index, out in gen.events():
        fmt.update(index, out.text, out.output_token_ids, out.finish_reason, out.num_cached_tokens)


class GenerationStream(StreamingResponse):
    """A streaming response that always closes its generation, however the stream ends."""

    def __init__(self, content: AsyncIterator[bytes], gen: Generation, media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._gen = gen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._gen.close()


async def stream_events(
    gen: Generation, fmt: Formatter, include_usage: bool
) -> AsyncIterator[bytes]:
    if fmt.chat:
        for index in range(fmt.n):
            yield fmt.chunk(index, {"role": "assistant", "content": ""}, None, include_usage)
    try:
        async for index, out in gen.events():
            fmt.update(index, out.text, out.output_token_ids, out.finish_reason,
                       out.num_cached_tokens)  # fmt: skip
            if out.new_token_ids or out.finished:  # one event per token, even text-less ones
                yield fmt.delta(index, out.delta_text, out.finish_reason, include_usage)
    except Exception as exc:  # the status line is sent: report in-band, as OpenAI does
        log.error("Stream failed", exc_info=exc)
        error = error_body(str(exc), "server_error")
        yield b"data: " + JSONResponse(error).body + b"\n\n"
    else:
        if include_usage:
            yield fmt.usage_chunk()
    yield SSE_DONE


class Formatter:
    """Builds OpenAI response objects for one request (completions or chat, n choices)."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int, n: int) -> None:
        self.model = model
        self.chat = chat
        self.n = n
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now_s()
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self.texts = [""] * n
        self.tokens = [0] * n
        self.reasons: list[Any] = [None] * n

    def update(
        self, index: int, text: str, output_ids: list[int], reason: str | None, cached: int
    ) -> None:
        self.texts[index] = text
        self.tokens[index] = len(output_ids)
        self.reasons[index] = reason
        self.cached_tokens = max(self.cached_tokens, cached)

    def usage(self) -> UsageInfo:
        completion = sum(self.tokens)
        return UsageInfo(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            prompt_tokens_details={"cached_tokens": self.cached_tokens},
        )

    def response(self) -> BaseModel:
        if self.chat:
            return ChatCompletionResponse(
                id=self.id, created=self.created, model=self.model, usage=self.usage(),
                choices=[
                    ChatChoice(index=i, message=ChatResponseMessage(content=self.texts[i]),
                               finish_reason=self.reasons[i])
                    for i in range(self.n)
                ],
            )  # fmt: skip
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=self.usage(),
            choices=[
                CompletionChoice(index=i, text=self.texts[i], finish_reason=self.reasons[i])
                for i in range(self.n)
            ],
        )  # fmt: skip

    def delta(self, index: int, text: str, reason: Any, include_usage: bool) -> bytes:
        if self.chat:
            return self.chunk(index, {"content": text} if text else {}, reason, include_usage)
        chunk = CompletionResponse(
            id=self.id, created=self.created, model=self.model,
            choices=[CompletionChoice(index=index, text=text, finish_reason=reason)],
        )  # fmt: skip
        return sse(chunk, include_usage)

    def chunk(self, index: int, delta: dict[str, str], reason: Any, include_usage: bool) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model,
            choices=[ChatChunkChoice(index=index, delta=delta, finish_reason=reason)],
        )  # fmt: skip
        return sse(chunk, include_usage)

    def usage_chunk(self) -> bytes:
        chunk: BaseModel
        if self.chat:
            chunk = ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage()
            )
        else:
            chunk = CompletionResponse(
                id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage()
            )
        return sse(chunk, True)
