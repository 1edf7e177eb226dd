"""`kvscale-router`: the OpenAI-compatible router in front of an endpoint's engine replicas.

In a cluster: `kvscale-router --endpoint NAME [--namespace NS]` follows the endpoint's engine
pods and its routing ConfigMap through the Kubernetes API. Locally: `--replicas a=URL,b=URL`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from kvscale_router import logs
from kvscale_router.admission import ClassConfigError, parse_traffic_classes
from kvscale_router.config import RouterConfig
from kvscale_router.deferred import DeferralPolicy
from kvscale_router.picker import POLICIES
from kvscale_router.replicas import ReplicaSource
from kvscale_router.server import Shutdown, create_app
from kvscale_router.static_source import StaticSource, parse_replicas

ROUTER_PORT = 8080
log = logging.getLogger("kvscale_router.cli")
CLASSES_HELP = (
    'JSON: [{"name": "interactive", "priority": 10, "maxConcurrency": 64, "maxQueue": 128, '
    '"maxQueueWaitSeconds": 2}, {"name": "batch", "deadlineSeconds": 3600}, ...]; the first is '
    "the default class; one with deadlineSeconds is deferrable"
)
# uvicorn closes an idle keep-alive connection after 5 s, exactly when httpx (the openai client)
# considers it still reusable: a request sent on it as the close crosses it fails with "Server
# disconnected" before the router sees it. Servers keep idle connections longer than clients
# and load balancers do (AWS ALB 60 s, Go 90 s; 620 s is GCP's advice for its balancers).
KEEP_ALIVE_S = 620.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscale-router", description=__doc__)
    p.add_argument("--version", action="version", version=f"kvscale-router {logs.version()}")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=ROUTER_PORT)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoint", help="LLMEndpoint name: follow its pods and weights")
    where.add_argument("--replicas", help="fixed replicas: [name=]http://host:port,...")
    p.add_argument("--namespace", help="the endpoint's namespace (default: the pod's own)")
    p.add_argument("--engine-port", type=int, default=8000)
    p.add_argument("--weights-file", type=Path, help="with --replicas: weights JSON, re-read "
                   "on SIGHUP")  # fmt: skip
    p.add_argument("--block-size", type=int, default=16, help="the engine's KV block size")
    p.add_argument("--max-blocks", type=int, default=32, help="prompt blocks hashed for affinity")
    p.add_argument("--policy", choices=POLICIES, default="affinity")
    p.add_argument("--epsilon", type=float, default=0.25, help="load bound: (1+e) x fair share")
    p.add_argument("--warmup-seconds", type=float, default=10.0,
                   help="a Ready pod without a published weight joins after this long")  # fmt: skip
    p.add_argument("--max-pending", type=int, default=256,
                   help="requests held while no replica is ready")  # fmt: skip
    p.add_argument("--pending-timeout", type=float, default=120.0,
                   help="seconds a request is held before 503")  # fmt: skip
    p.add_argument("--max-attempts", type=int, default=3,
                   help="replicas tried before the first byte")  # fmt: skip
    p.add_argument("--traffic-classes", help=CLASSES_HELP)
    p.add_argument("--deferred-spare-tokens", type=float, default=8192.0,
                   help="deferrable classes: outstanding tokens a replica of weight 1 may carry "
                   "and still take deferred work, unless the routing ConfigMap publishes its "
                   "tokenBudgets")  # fmt: skip
    p.add_argument("--deferred-hot-weight", type=float, default=0.5,
                   help="a replica weighted below this is hot: no deferred work")  # fmt: skip
    p.add_argument("--deferred-safety", type=float, default=2.0,
                   help="a deferred request goes, however loaded the replicas, once its time "
                   "left is this many times its expected run time (plus the margin)")  # fmt: skip
    p.add_argument("--deferred-margin-seconds", type=float, default=5.0)
    p.add_argument("--deferred-prior-tokens-per-second", type=float, default=10.0,
                   help="per-request decode rate assumed before deferred requests "
                   "completed")  # fmt: skip
    p.add_argument("--shutdown-grace-seconds", type=float, default=5.0,
                   help="after SIGTERM, how long the router still serves with /ready false and "
                   "every response closing its connection, while the Service's endpoints and "
                   "the clients' connection pools move to other routers")  # fmt: skip
    p.add_argument("--drain-seconds", type=float, default=30.0,
                   help="then, how long in-flight requests may finish")  # fmt: skip
    p.add_argument("--keep-alive-seconds", type=float, default=KEEP_ALIVE_S,
                   help="an idle client connection is kept this long (longer than any "
                   "client's or load balancer's idle timeout, so a reused connection is never "
                   "closed under a request)")  # fmt: skip
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=logs.LOG_FORMATS, default="text",
                   help="json: one object a line (timestamp, level, logger, message)")  # fmt: skip
    return p


def namespace(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def source_of(args: argparse.Namespace) -> ReplicaSource:
    if args.replicas:
        return StaticSource(parse_replicas(args.replicas), args.weights_file)
    from kvscale_router.kube_source import KubeSource  # the Kubernetes client only when needed

    return KubeSource(namespace(args.namespace), args.endpoint, args.engine_port)


def router_config(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        block_size=args.block_size,
        max_blocks=args.max_blocks,
        policy=args.policy,
        epsilon=args.epsilon,
        warmup_s=args.warmup_seconds,
        max_pending=args.max_pending,
        pending_timeout_s=args.pending_timeout,
        max_attempts=args.max_attempts,
        traffic_classes=parse_traffic_classes(args.traffic_classes),
        spare_tokens=args.deferred_spare_tokens,
        hot_weight=args.deferred_hot_weight,
        deferral=DeferralPolicy(
            args.deferred_safety, args.deferred_margin_seconds,
            args.deferred_prior_tokens_per_second,
        ),
    )  # fmt: skip


class GracefulServer(uvicorn.Server):
    """On the first SIGTERM: shutdown starts (/ready false, connections closed after each
    response) and the router serves on for `grace_s`; then uvicorn's graceful shutdown (no new
    connections, in-flight requests finish within `timeout_graceful_shutdown`)."""

    def __init__(self, config: uvicorn.Config, shutdown: Shutdown, grace_s: float) -> None:
        super().__init__(config)
        self.stopping, self.grace_s = shutdown, grace_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.stopping.started or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.stopping.started = True
        log.info("Received SIGTERM: serving for %.1f s more with /ready false", self.grace_s)
        loop, stop = self._loop, super().handle_exit
        loop.call_soon_threadsafe(lambda: loop.call_later(self.grace_s, stop, sig, frame))


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        config, source = router_config(args), source_of(args)
    except (ValueError, ClassConfigError) as exc:
        parser.error(str(exc))
    app = create_app(config, source)
    server = GracefulServer(
        uvicorn.Config(
            app, host=args.host, port=args.port, loop="uvloop", http="httptools",
            access_log=False, log_level=args.log_level,
            # JSON: uvicorn's loggers keep no handlers of their own and reach the root's
            log_config=None if args.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
            timeout_graceful_shutdown=int(args.drain_seconds),
            timeout_keep_alive=int(args.keep_alive_seconds),
        ),
        app.state.shutdown,
        args.shutdown_grace_seconds,
    )  # fmt: skip
    server.run()
    sys.exit(0 if server.started else 1)


if __name__ == "__main__":
    main()
