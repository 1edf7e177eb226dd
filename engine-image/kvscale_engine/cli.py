"""`kvscale-engine`: serve a model over the OpenAI API, or write the tiny test checkpoint.

    kvscale-engine serve --model DIR [--served-model-name NAME] [--port 8000] [engine flags]
    kvscale-engine tiny-checkpoint DIR [--arch llama] [--seed 0] [--vllm]

The flag names match the ones the operator renders into Deployments (and, where they overlap,
vLLM's). The OpenAI API, probes and metrics listen on --port; POST /drain, GET /drain and
POST /undrain only on --admin-port, which no Service exposes. SIGTERM: readiness goes false at
once, requests that still arrive during --shutdown-grace (while endpoints update) are served, then
new requests get 503, admitted ones finish within --drain-timeout, and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from kvscale_engine import fetch
from kvscale_engine.config import ConfigError, EngineConfig
from kvscale_engine.server.admission import AdmissionConfigError, parse_traffic_classes

log = logging.getLogger("kvscale_engine")
# uvicorn's default closes an idle connection after 5 s, while a client may reuse it for longer
# (the router's pool: 15 s; httpx: 5 s, a close and a request can cross): servers outlast clients
KEEP_ALIVE_S = 620.0

# flag -> EngineConfig field; unset flags keep EngineConfig's defaults
_ENGINE_FLAGS: dict[str, tuple[str, type]] = {
    "max_model_len": ("--max-model-len", int),
    "block_size": ("--block-size", int),
    "memory_fraction": ("--memory-fraction", float),
    "num_kv_blocks": ("--num-kv-blocks", int),
    "max_num_seqs": ("--max-num-seqs", int),
    "max_num_batched_tokens": ("--max-num-batched-tokens", int),
    "scheduling": ("--scheduling", str),
    "device": ("--device", str),
    "dtype": ("--dtype", str),
    "seed": ("--seed", int),
    "decode_attention": ("--decode-attention", str),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscale-engine", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    serve.add_argument("--model", required=True, help="checkpoint directory, or dummy:<arch>")
    serve.add_argument("--served-model-name", help="name clients use (default: the directory)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000)
    for field, (flag, kind) in _ENGINE_FLAGS.items():
        serve.add_argument(flag, dest=field, type=kind, default=None)
    serve.set_defaults(device=os.environ.get("KVSCALE_DEVICE") or None)
    serve.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None
    )
    serve.add_argument(
        "--enforce-eager", action="store_true", default=None,
        help="run every step eagerly (no CUDA graphs for decode steps)",
    )  # fmt: skip
    serve.add_argument(
        "--small-batch-weights", action=argparse.BooleanOptionalAction, default=None,
        help="fp32 on the CPU: keep a second copy of each linear's weight for small steps, "
        "where it multiplies faster than oneDNN's blocked copy: the C kernel's panels for 1-48 "
        "rows (AVX-512), else the checkpoint's layout for 1-3 (on by default; twice the weight "
        "memory)",
    )  # fmt: skip
    serve.add_argument(
        "--traffic-classes",
        help='JSON list: [{"name": "interactive", "priority": 10, "maxQueueWaitSeconds": 2,'
        ' "maxConcurrency": 8, "maxQueue": 64}, ...]; the first is the default class',
    )
    serve.add_argument(
        "--max-concurrency",
        type=int,
        help="admitted requests at once (default: as many as fit the KV budget at max-model-len)",
    )
    serve.add_argument(
        "--admission", action=argparse.BooleanOptionalAction, default=True,
        help="admission control (on by default)",
    )  # fmt: skip
    serve.add_argument("--drain-timeout", type=float, default=30.0, help="seconds")
    serve.add_argument(
        "--shutdown-grace", type=float, default=5.0,
        help="seconds after SIGTERM during which requests are still served (readiness false)",
    )  # fmt: skip
    serve.add_argument(
        "--admin-port", type=int, default=8001,
        help="port of POST /drain, GET /drain, POST /undrain (0: no admin port)",
    )  # fmt: skip
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    serve.add_argument(
        "--keep-alive-timeout", type=float, default=KEEP_ALIVE_S,
        help="seconds an idle client connection is kept: longer than the clients' own idle "
        "timeout (the router's pool keeps 15 s), so a reused connection is never closed under "
        "a request",
    )  # fmt: skip
    serve.add_argument("--log-level", default="info")
    fetch.add_parser(sub)
    tiny = sub.add_parser("tiny-checkpoint", help="write the tiny seeded test checkpoint")
    tiny.add_argument("path", type=Path)
    tiny.add_argument("--arch", default="llama")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--vllm", action="store_true", help="head_dim 64, which vLLM's CPU attention takes"
    )
    return parser


def engine_config(args: argparse.Namespace) -> EngineConfig:
    fields: dict[str, Any] = {
        f: getattr(args, f) for f in _ENGINE_FLAGS if getattr(args, f) is not None
    }
    if args.enable_prefix_caching is not None:
        fields["enable_prefix_caching"] = args.enable_prefix_caching
    if args.enforce_eager:
        fields["enforce_eager"] = True
    if args.small_batch_weights is not None:
        fields["small_batch_weights"] = args.small_batch_weights
    return EngineConfig(model=args.model, **fields)


def build_server(args: argparse.Namespace) -> DrainingServer:
    """The uvicorn server for `serve`; configuration errors surface here, before anything runs."""
    # imported here so that `tiny-checkpoint` and `--help` do not pay for torch
    from kvscale_engine.server.app import create_app
    from kvscale_engine.server.config import ServerConfig

    cfg = engine_config(args)
    if args.admin_port == args.port:
        raise ConfigError(f"--admin-port must differ from --port ({args.port})")
    server_cfg = ServerConfig(
        served_model_name=args.served_model_name or Path(cfg.model_source).name or cfg.model,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        traffic_classes=parse_traffic_classes(args.traffic_classes),
        admission=args.admission,
        max_concurrency=args.max_concurrency,
        drain_timeout_s=args.drain_timeout,
        shutdown_grace_s=args.shutdown_grace,
        admin_port=args.admin_port or None,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(cfg, server_cfg)  # the engine runs in a child process
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(args.drain_timeout) + 5),
        timeout_keep_alive=int(args.keep_alive_timeout),
    )
    return DrainingServer(config, app.state, server_cfg)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM: readiness false, serve through the grace delay, drain, shut down."""

    def __init__(self, config: uvicorn.Config, app_state: Any, server_cfg: Any) -> None:
        super().__init__(config)
        self._app_state = app_state
        self._drain_timeout_s: float = server_cfg.drain_timeout_s
        self._grace_s: float = server_cfg.shutdown_grace_s
        self._admin_port: int | None = server_cfg.admin_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    def listen(self) -> list[socket.socket]:
        """Sockets for the API port and the admin port (when there is one)."""
        ports = [self.config.port, self._admin_port]
        return [listen(self.config.host, port) for port in ports if port]

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        log.info(
            "Received SIGTERM: serving for %.1f s more, then draining for up to %.0f s",
            self._grace_s,
            self._drain_timeout_s,
        )
        self._loop.call_soon_threadsafe(self._start_drain, sig, frame)

    def _start_drain(self, sig: int, frame: FrameType | None) -> None:
        self._drain_task = asyncio.ensure_future(self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._app_state, "server", None)
        if state is not None:
            state.begin_shutdown()
            if not state.draining:  # nobody sends to a replica drained before
                await asyncio.sleep(self._grace_s)  # endpoints and routers catch up meanwhile
            drained = await state.drain(self._drain_timeout_s)
            log.info("Drain %s; shutting down", "finished" if drained else "timed out")
        super().handle_exit(sig, frame)


def tiny_checkpoint(args: argparse.Namespace) -> None:
    from kvscale_engine.engine.checkpoint import VLLM_CPU_SIZES, write_tiny_checkpoint

    sizes = VLLM_CPU_SIZES if args.vllm else {}
    write_tiny_checkpoint(args.path, arch=args.arch, seed=args.seed, **sizes)
    print(args.path)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "tiny-checkpoint":
        tiny_checkpoint(args)
        return
    if args.command == "fetch":
        sys.exit(fetch.fetch(args))
    try:
        server = build_server(args)
        sockets = server.listen()
    except (ConfigError, AdmissionConfigError) as exc:
        print(f"kvscale-engine: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    server.run(sockets)


if __name__ == "__main__":
    main()
