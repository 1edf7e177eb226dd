"""One streamed request against any OpenAI-compatible endpoint, timed on the client.

TTFT is from sending the request to the first chunk that carries output (servers send one per
token, text or not); ITL is each gap between such chunks after that; E2E runs to the end of the
stream. Token counts come from the final usage chunk (`stream_options.include_usage`), or the
number of output chunks without it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvscale.tools.workload import PlannedRequest

REFUSED = (429, 503)


@dataclass
class RequestRecord:
    index: int
    traffic_class: str | None
    input_len: int
    output_len_requested: int
    scheduled_s: float
    start_s: float = 0.0  # offsets from the start of the run
    end_s: float = 0.0
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_s is not None

    @property
    def refused(self) -> bool:
        return self.status in REFUSED

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Target:
    base_url: str  # http://host:port (no /v1)
    model: str
    endpoint: str = "/v1/completions"
    ignore_eos: bool = True
    class_header: str = "x-kvscale-class"
    keep_text: bool = False

    @property
    def chat(self) -> bool:
        return self.endpoint.endswith("/chat/completions")


def request_body(target: Target, req: PlannedRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension; output lengths follow the workload
    if target.chat:
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = req.prompt
    return body


def _chunk_text(chunk: dict[str, Any], chat: bool) -> tuple[str | None, str | None]:
    """(output text, finish reason); text is None for chunks that carry no output (usage, role)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None, None
    choice = choices[0]
    if not chat:
        return choice.get("text") or "", choice.get("finish_reason")
    delta = choice.get("delta") or {}
    if "role" in delta:
        return None, choice.get("finish_reason")
    return delta.get("content") or "", choice.get("finish_reason")


async def send(
    client: httpx.AsyncClient, target: Target, req: PlannedRequest, t0: float
) -> RequestRecord:
    rec = RequestRecord(req.index, req.traffic_class, req.input_len, req.output_len, req.at_s)
    headers = {target.class_header: req.traffic_class} if req.traffic_class else {}
    url = target.base_url.rstrip("/") + target.endpoint
    start = time.perf_counter()
    rec.start_s = start - t0
    last: float | None = None
    chunks = 0
    try:
        async with client.stream("POST", url, json=request_body(target, req), headers=headers) as r:
            rec.status = r.status_code
            if r.status_code != 200:
                body = await r.aread()
                rec.error = body.decode(errors="replace")[:500]
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = json.dumps(chunk["error"])[:500]
                    break
                _usage(rec, chunk.get("usage"))
                text, reason = _chunk_text(chunk, target.chat)
                rec.finish_reason = reason or rec.finish_reason
                if text is not None:  # a token arrived, even one with no printable text
                    chunks += 1
                    if target.keep_text:
                        rec.text += text
                    if last is None:
                        rec.ttft_s = now - start
                    else:
                        rec.itls_s.append(now - last)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        rec.end_s = time.perf_counter() - t0
    if rec.output_tokens == 0:
        rec.output_tokens = chunks
    return rec


def _usage(rec: RequestRecord, usage: dict[str, Any] | None) -> None:
    if not usage:
        return
    rec.output_tokens = int(usage.get("completion_tokens") or 0)
    rec.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = details.get("cached_tokens")
