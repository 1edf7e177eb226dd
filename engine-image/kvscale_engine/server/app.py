"""The OpenAI-compatible HTTP server: `create_app(engine, config)` returns the ASGI app.

FastAPI on uvicorn (uvloop + httptools): the stack vLLM and SGLang serve with, so clients and
operators meet familiar behaviour. Bodies are parsed straight from bytes by pydantic's Rust core
and responses are written as pre-serialised bytes, so the per-token cost is one JSON dump. No
module-level state: everything lives on `app.state`, built in the lifespan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from kvscale_engine.sampling_params import SamplingError, SamplingParams
from kvscale_engine.server.admission_queue import Refused
from kvscale_engine.server.config import CLASS_HEADER, ServerConfig
from kvscale_engine.server.metrics import CONTENT_TYPE, EngineMetrics
from kvscale_engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    error_body,
    now_s,
)
from kvscale_engine.server.responses import Formatter, GenerationStream, collect, stream_events
from kvscale_engine.server.state import EngineSource, ServerState

log = logging.getLogger(__name__)
T = TypeVar("T")
Body = TypeVar("Body", CompletionRequest, ChatCompletionRequest)
JSON = "application/json"


class ClientError(Exception):
    """Bad input: becomes a 4xx with an OpenAI-style error body."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


class ClientGone(Exception):
    """The client disconnected before the response started."""


def create_app(engine: EngineSource, config: ServerConfig) -> FastAPI:
    """The server around `engine`: an EngineConfig (the engine runs in a child process), or an
    LLMEngine or a factory that builds one off the loop (it runs on a thread of this process)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = EngineMetrics(
            config.served_model_name,
            config.max_model_len,
            config.class_names,
            config.engine_label,
            deferrable=[c.name for c in config.traffic_classes if c.deferrable],
        )
        state = ServerState(config, metrics)
        app.state.server = state
        app.state.metrics_registry = metrics.registry
        loader = asyncio.create_task(state.load(engine), name="engine-load")
        app.state.loader = loader
        try:
            yield
        finally:
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await state.close()

    app = FastAPI(title="kvscale engine", lifespan=lifespan)
    _add_error_handlers(app)
    _add_probe_routes(app)
    _add_admin_routes(app)
    _add_openai_routes(app)
    return app


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type=JSON)


# errors


def _error(status: int, message: str, type_: str, **kw: Any) -> JSONResponse:
    headers = kw.pop("headers", None)
    return JSONResponse(error_body(message, type_, **kw), status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    async def client_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientError)
        type_ = "invalid_request_error" if exc.status < 500 else "server_error"
        return _error(exc.status, str(exc), type_, param=exc.param, code=exc.code)

    async def refused(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        type_ = "rate_limit_exceeded" if exc.status == 429 else "service_unavailable"
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
        return _error(exc.status, str(exc), type_, code=exc.reason, headers=headers)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, str(exc.detail), type_, headers=exc.headers)

    async def server_error(_: Request, exc: Exception) -> Response:
        log.error("Request failed", exc_info=exc)
        return _error(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_exception_handler(ClientError, client_error)
    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)


def _validation_error(exc: ValidationError) -> ClientError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return ClientError(f"{param}: {first['msg']}" if param else first["msg"], param=param)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ClientError(f"request body exceeds {limit} bytes", status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ClientError(f"request body exceeds {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, model: type[T]) -> T:
    body = await _read_body(request, _state(request).config.max_body_bytes)
    try:
        parsed: T = model.model_validate_json(body)  # type: ignore[attr-defined]
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ClientError("request body is not valid JSON") from exc
        raise _validation_error(exc) from exc
    return parsed


# probes and metrics


def _add_probe_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        state = _state(request)
        if not state.healthy:
            return _error(500, "the engine failed", "server_error")
        return JSONResponse({"status": "ok", "phase": state.status})

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        state = _state(request)
        body = {"ready": state.ready, "phase": state.status, "in_flight": state.active}
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = _state(request)
        state.refresh_load_metrics()
        state.metrics.set_ready(state.ready)
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        cfg = _state(request).config
        card = ModelCard(
            id=cfg.served_model_name,
            created=now_s(),
            root=cfg.served_model_name,
            max_model_len=cfg.max_model_len,
        )
        return _json(ModelList(data=[card]))


# admin: answered only on the admin port, which no Service exposes


def _require_admin_port(request: Request) -> ServerState:
    state = _state(request)
    server = request.scope.get("server")
    admin_port = state.config.admin_port
    if admin_port is None or server is None or server[1] != admin_port:
        raise HTTPException(404, "Not Found")
    return state


def _add_admin_routes(app: FastAPI) -> None:
    @app.post("/drain")
    async def drain(request: Request) -> Response:
        """Readiness false, new requests refused; `?wait=S` answers once idle or after S s.

        Idempotent. The body tells the in-flight count and whether it reached 0 (`drained`).
        """
        state = _require_admin_port(request)
        wait = _float_param(request, "wait", 0.0)
        state.start_draining()
        if wait > 0:
            await state.wait_idle(wait)
        return JSONResponse(state.drain_status())

    @app.get("/drain")
    async def drain_status(request: Request) -> Response:
        """The drain state and the in-flight count, changing nothing: what the operator polls."""
        return JSONResponse(_require_admin_port(request).drain_status())

    @app.post("/undrain")
    async def undrain(request: Request) -> Response:
        """Cancel a drain (an aborted scale-in); 409 once the process is shutting down."""
        state = _require_admin_port(request)
        if not state.stop_draining():
            return _error(409, "the server is shutting down", "conflict", code="stopping")
        return JSONResponse(state.drain_status())


def _float_param(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError as exc:
        raise ClientError(f"{name} must be a number of seconds", param=name) from exc


# completions


def _add_openai_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        state, body = await _accept(request, CompletionRequest)
        prompt = body.single_prompt
        ids = state.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return await _serve(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        state, body = await _accept(request, ChatCompletionRequest)
        try:
            text = state.tokenizer.apply_chat_template(body.chat_messages())
        except ValueError as exc:
            raise ClientError(str(exc), param="messages") from exc
        ids = state.tokenizer.encode(text, add_special_tokens=False)
        return await _serve(request, body, ids, chat=True)


async def _accept(request: Request, kind: type[Body]) -> tuple[ServerState, Body]:
    """The parsed body of a request the server can take: loaded, and the model is the one served."""
    state = _state(request)
    body = await _parse(request, kind)
    state.require_loaded()
    model = body.model
    if model is not None and model != state.config.served_model_name:
        raise ClientError(
            f"The model {model!r} does not exist", status=404, param="model", code="model_not_found"
        )
    return state, body


def _sampling(
    state: ServerState, body: CompletionRequest | ChatCompletionRequest, prompt_len: int
) -> list[SamplingParams]:
    max_len = state.config.max_model_len
    if prompt_len == 0:
        raise ClientError("the prompt is empty", param="prompt")
    if prompt_len >= max_len:
        raise ClientError(
            f"This model's maximum context length is {max_len} tokens, but the prompt has "
            f"{prompt_len} tokens.",
            param="messages" if isinstance(body, ChatCompletionRequest) else "prompt",
            code="context_length_exceeded",
        )
    max_tokens = body.max_tokens if body.max_tokens is not None else max_len - prompt_len
    if prompt_len + max_tokens > max_len:
        raise ClientError(
            f"This model's maximum context length is {max_len} tokens; the prompt has "
            f"{prompt_len} tokens and max_tokens asks for {max_tokens} more.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if not state.fits_kv_pool(prompt_len + max_tokens):
        raise ClientError(
            f"prompt plus max_tokens ({prompt_len + max_tokens} tokens) exceeds this replica's "
            f"KV cache ({state.num_kv_blocks} blocks of {state.block_size} tokens)",
            param="max_tokens",
            code="context_length_exceeded",
        )
    vocab = state.vocab_size
    prompt = body.single_prompt if isinstance(body, CompletionRequest) else None
    if isinstance(prompt, list) and any(t >= vocab for t in prompt):
        raise ClientError(f"prompt token ids must be below {vocab}", param="prompt")
    try:
        return [
            SamplingParams(
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                max_tokens=max_tokens,
                stop=tuple(body.stop_list),
                stop_token_ids=tuple(body.stop_token_ids or ()),
                ignore_eos=body.ignore_eos,
                seed=None if body.seed is None else body.seed + i,
            )
            for i in range(body.n)
        ]
    except SamplingError as exc:
        raise ClientError(str(exc)) from exc


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await work; if the client goes first, cancel the work and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _serve(
    request: Request,
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
    chat: bool,
) -> Response:
    state = _state(request)
    params = _sampling(state, body, len(prompt_ids))
    kv_tokens = sum(len(prompt_ids) + p.max_tokens for p in params)
    try:
        admitted = await _unless_disconnected(
            request, state.admit(request.headers.get(CLASS_HEADER), kv_tokens)
        )
    except ClientGone:
        return Response(status_code=499)
    gen = state.generate(admitted, prompt_ids, params)
    fmt = Formatter(state.config.served_model_name, chat, len(prompt_ids), body.n)
    if body.stream:
        events = stream_events(gen, fmt, body.include_usage)
        return GenerationStream(events, gen, media_type="text/event-stream")
    try:
        await _unless_disconnected(request, collect(gen, fmt))
    except ClientGone:
        return Response(status_code=499)
    except ValueError as exc:
        raise ClientError(str(exc)) from exc
    finally:
        gen.close()
    return _json(fmt.response())
