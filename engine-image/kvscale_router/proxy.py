"""One request through the router: parse, defer (deferrable classes), admit, hold from zero,
pick, send, relay.

Everything before the first byte reaches the client may be redone: a replica that cannot be
reached or answers 429/502/503/504 is skipped and the request goes to another one (at most
`max_attempts` attempts). When every routable replica was tried and one of them could not be
reached, that one is tried again after a pause: a lone replica with a backlog must not turn a
slow connect into a refusal. Once the relay has started, the response is the replica's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvscale_router.admission import CLASS_HEADER, Admission, Refused, TrafficClass
from kvscale_router.config import RouterConfig
from kvscale_router.deferred import Release
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.picker import Picker
from kvscale_router.prefix import block_keys
from kvscale_router.protocol import (
    BadRequest,
    OutputTally,
    RoutedRequest,
    error_body,
    parse_body,
)
from kvscale_router.relay import Relay, forwarded_headers
from kvscale_router.release import Releaser, deferred_of
from kvscale_router.replicas import ReplicaTable

RETRY_STATUSES = frozenset({429, 502, 503, 504})
UNREACHABLE_PAUSE_S = 0.25  # before the same replica is tried again; doubles each attempt
Reply = Response | Relay  # both are ASGI apps Starlette runs


@dataclass
class Router:
    """Everything a request needs; built in the app's lifespan, held on app.state."""

    config: RouterConfig
    table: ReplicaTable
    picker: Picker
    admission: Admission
    hold: Hold
    metrics: RouterMetrics
    client: aiohttp.ClientSession
    releaser: Releaser


def error_response(status: int, message: str, type_: str, retry_after: int | None = None,
                   code: str | None = None) -> JSONResponse:  # fmt: skip
    headers = {"retry-after": str(retry_after)} if retry_after is not None else None
    return JSONResponse(error_body(message, type_, code), status_code=status, headers=headers)


def refusal(router: Router, refused: Refused) -> JSONResponse:
    router.metrics.refusals.labels(refused.reason, refused.traffic_class).inc()
    router.metrics.requests.labels("", str(refused.status)).inc()
    kind = "rate_limit_exceeded" if refused.status == 429 else "service_unavailable"
    return error_response(refused.status, str(refused), kind, refused.retry_after_s,
                          refused.reason)  # fmt: skip


async def generate(router: Router, request: Request) -> Reply:
    """POST /v1/completions and /v1/chat/completions."""
    arrival = time.perf_counter()
    body = await request.body()
    try:
        routed = parse_body(body)
    except BadRequest as exc:
        router.metrics.requests.labels("", "400").inc()
        return error_response(400, str(exc), "invalid_request_error")
    cls = router.admission.resolve(request.headers.get(CLASS_HEADER))
    work = asyncio.ensure_future(_admit_and_send(router, request, body, routed, cls, arrival))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not work.done():  # the client left while queued, held or waiting for a replica
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        router.metrics.requests.labels("", "499").inc()
        return Response(status_code=499)
    gone.cancel()
    try:
        return work.result()
    except Refused as refused:
        return refusal(router, refused)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _admit_and_send(
    router: Router,
    request: Request,
    body: bytes,
    routed: RoutedRequest,
    cls: TrafficClass,
    arrival: float,
) -> Reply:
    release: Release | None = None
    if cls.deferrable:
        deferred = deferred_of(cls, time.monotonic(), routed.cost_tokens, routed.output_tokens)
        release = await router.releaser.wait(deferred)
    try:
        return await _admit(router, request, body, routed, cls, arrival, release)
    finally:
        if release is not None:
            router.releaser.settle(release)  # started on its replica, or failed


async def _admit(
    router: Router,
    request: Request,
    body: bytes,
    routed: RoutedRequest,
    cls: TrafficClass,
    arrival: float,
    release: Release | None,
) -> Reply:
    m = router.metrics
    queued = time.perf_counter()
    m.queue_depth.labels(cls.name).set(router.admission.depth(cls) + 1)
    try:
        await router.admission.enter(cls)
    finally:
        m.queue_depth.labels(cls.name).set(router.admission.depth(cls))
    waited = time.perf_counter() - queued
    m.queue_wait.labels(cls.name).observe(waited)
    if release is not None:  # its time in the deferred queue is waiting too
        waited = time.perf_counter() - arrival
    try:
        waited += await router.hold.until_routable(cls.name)
        relay = await _send(router, request, body, routed, arrival, waited, cls, release)
    except BaseException:
        router.admission.leave(cls)
        router.releaser.kick()
        raise
    return relay


async def _send(
    router: Router,
    request: Request,
    body: bytes,
    routed: RoutedRequest,
    arrival: float,
    waited: float,
    cls: TrafficClass,
    release: Release | None = None,
) -> Relay:
    cfg, picker, m = router.config, router.picker, router.metrics
    keys = block_keys(routed.prompt_view, cfg.block_size, cfg.max_blocks)
    cost = float(routed.cost_tokens)
    headers = forwarded_headers(request.headers.items())
    tried: set[str] = set()
    unreachable: set[str] = set()
    for attempt in range(cfg.max_attempts):
        live = router.table.routable()
        if release is not None and release.replica in live and release.replica not in tried:
            live = {release.replica: live[release.replica]}  # where the release found room
        choice = picker.pick(keys, cost, live, exclude=tried)
        if choice is None and unreachable & live.keys():
            # Every routable replica was tried and one could not be reached: a replica with a
            # backlog can leave a connection unaccepted past the connect timeout. Nothing was
            # relayed yet, so try it again after a pause rather than refuse the request.
            await asyncio.sleep(UNREACHABLE_PAUSE_S * 2**attempt)
            choice = picker.pick(keys, cost, router.table.routable(), exclude=tried - unreachable)
        if choice is None:
            break
        name = choice.name
        tried.add(name)
        m.picks.labels(name, choice.reason).inc()
        url = router.table.pods[name].url + request.url.path
        picker.started(name, cost)
        _show_load(router, name)
        sent_at = time.perf_counter()
        try:
            upstream = await router.client.post(url, data=body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            unreachable.add(name)
            _finish(router, name, cost)
            m.upstream_errors.labels(name, type(exc).__name__).inc()
            m.retries.labels("unreachable").inc()
            continue
        others = set(router.table.routable()) - tried
        if upstream.status in RETRY_STATUSES and others and len(tried) < cfg.max_attempts:
            upstream.close()
            _finish(router, name, cost)
            m.retries.labels(str(upstream.status)).inc()
            continue
        return _relay(router, upstream, name, cost, cls, sent_at - arrival - waited, release)
    raise Refused(503, "no_replica", 1, cls.name,
                  f"No replica could take the request (tried {len(tried)}).")  # fmt: skip


def _relay(
    router: Router, upstream: aiohttp.ClientResponse, name: str, cost: float, cls: TrafficClass,
    before_s: float, release: Release | None,
) -> Relay:  # fmt: skip
    m = router.metrics
    tally = OutputTally() if release is not None else None
    sent_at = time.monotonic()

    def done(outcome: str) -> None:
        _finish(router, name, cost)
        router.admission.leave(cls)
        code = str(upstream.status) if outcome == "ok" else outcome
        m.requests.labels(name, code).inc()
        if outcome == "upstream_failed":
            m.upstream_errors.labels(name, "mid_stream").inc()
        if release is not None and tally is not None:
            complete = outcome == "ok" and upstream.status == 200
            seconds = time.monotonic() - sent_at
            router.releaser.finished(release, name, tally.tokens, seconds, complete)

    observe = tally.feed if tally is not None else None
    return Relay(upstream, done, lambda relay_s: m.added.observe(before_s + relay_s), observe)


def _finish(router: Router, name: str, cost: float) -> None:
    router.picker.finished(name, cost)
    _show_load(router, name)
    router.releaser.kick()


def _show_load(router: Router, name: str) -> None:
    router.metrics.in_flight.labels(name).set(router.picker.in_flight.get(name, 0))
    router.metrics.outstanding_tokens.labels(name).set(router.picker.tokens.get(name, 0.0))


async def models(router: Router, request: Request) -> Response:
    """GET /v1/models from the least loaded replica (all serve the same model)."""
    live = router.table.routable()
    if not live:
        router.metrics.requests.labels("", "503").inc()
        return error_response(503, "No replica is ready.", "service_unavailable", 1)
    name = min(live, key=lambda n: router.picker.tokens.get(n, 0.0))
    try:
        async with router.client.get(router.table.pods[name].url + "/v1/models") as upstream:
            body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        message = f"Replica {name} is unreachable: {exc!r}"
        return error_response(503, message, "service_unavailable", 1)
    router.metrics.requests.labels(name, str(upstream.status)).inc()
    return Response(body, upstream.status, media_type="application/json")
