"""OpenAI-compatible request and response models: the wire format of the engine server.

Requests are validated here once, at the edge; a bad field becomes an HTTP 400 with an
OpenAI-style error body. Unknown fields are refused rather than silently ignored, so that a
client never believes a parameter took effect when it did not.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TokenIds = list[Annotated[int, Field(ge=0)]]
FinishReason = Literal["stop", "length", "abort"]
Choice = TypeVar("Choice", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM's extension (usage in every chunk), which load generators such as GuideLLM send:
    # accepted so that they run, but usage still comes once, in the last chunk
    continuous_usage_stats: bool = False


class _SamplingFields(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError("penalties are not supported by this engine; send 0 or omit")
        return value

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None
    best_of: Literal[1] | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(
        cls, value: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], str | list) and len(value) != 1:
                raise ValueError("batched prompts are not supported: send one prompt per request")
        return value

    @property
    def single_prompt(self) -> str | list[int]:
        """The one prompt, unwrapped from a one-element batch."""
        value = self.prompt
        if isinstance(value, list) and isinstance(value[0], str | list):
            return value[0]  # type: ignore[return-value]
        return value  # type: ignore[return-value]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: Literal[False] | None = None

    @model_validator(mode="after")
    def _one_token_limit(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text} for m in self.messages]


# responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None


class _Response(BaseModel, Generic[Choice]):
    """What every completion response and chunk starts with; `object` names the kind."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None


class CompletionResponse(_Response[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"
    usage: UsageInfo | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionResponse(_Response[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"
    usage: UsageInfo


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, str]  # {"role", "content"} first, then {"content"}, {} with the finish
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Response[ChatChunkChoice]):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvscale"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(
    message: str, type_: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return ErrorResponse(
        error=ErrorInfo(message=message, type=type_, param=param, code=code)
    ).model_dump()


SSE_DONE = b"data: [DONE]\n\n"


def sse(chunk: BaseModel, include_usage: bool) -> bytes:
    """One server-sent event as OpenAI streams it; chunks carry `usage` only when asked for."""
    exclude = None if include_usage else {"usage"}
    return b"data: " + chunk.model_dump_json(exclude=exclude).encode() + b"\n\n"
