"""What a platform watches a running gateway through: ``/healthz`` and ``/readyz`` on the agents'
listener, ``/metrics`` on the control plane.

Invariant: ``/healthz`` and ``/readyz`` need no credential and so say nothing beyond status: alive;
policies loaded, evidence writable, and the names of the upstreams that are down (names the operator
chose in the configuration). ``/metrics`` is behind the control plane's credential, like every other
control-plane route (``control.auth.AdminAuth``), and holds counts and timings, never an agent id, a
tool name or an argument.

``/readyz`` answers 503 when a call could not be served as configured now: the evidence can no longer
be written (every call is refused), or no upstream is up with its pins readable (``pin_tools``: an
upstream whose pins cannot be read has every tool held back, as if it were down, until a retry reads
them). An upstream that is down, or whose pins cannot be read, while others serve is named
(``upstreams_down``, ``pins_unavailable``), and the gateway stays ready: the calls to the others are
served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drawbridge.control.auth import AdminAuth
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.state.approvals import ApprovalStatus

UpstreamStates = Callable[[], Mapping[str, bool]]


def readiness(runtime: Runtime, upstreams: UpstreamStates) -> tuple[bool, dict[str, Any]]:
    """Whether the gateway is ready, and the status fields ``/readyz`` shows (module docstring)."""
    store = runtime.policy_store
    states = upstreams()
    down = sorted(name for name, up in states.items() if not up)
    evidence_ok = not runtime.guard.failed
    pins = runtime.pins
    unreadable = pins.unavailable() if pins is not None else []
    body: dict[str, Any] = {
        "policies": "loaded" if store is not None else "none: every call is refused",
        "policy_reload_failed": store is not None and store.last_error is not None,
        "evidence": "writable" if evidence_ok else "failed",
        "upstreams_down": down,
    }
    if pins is not None:
        body["pins_unavailable"] = unreadable
    serving = [name for name in states if name not in down and name not in unreadable]
    ready = evidence_ok and (not states or bool(serving))
    body["status"] = "ready" if ready else "not ready"
    return ready, body


def health_routes(runtime: Runtime, upstreams: UpstreamStates) -> list[Route]:
    """``/healthz`` and ``/readyz`` (module docstring), for the agents' listener."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        ready, body = readiness(runtime, upstreams)
        return JSONResponse(body, status_code=200 if ready else 503)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]


async def pending_approvals(runtime: Runtime) -> int | None:
    if runtime.engine is None:
        return None
    return len(await runtime.engine.store.list(ApprovalStatus.PENDING))


def metrics_route(runtime: Runtime, auth: AdminAuth) -> Route:
    """``/metrics`` in the Prometheus text format, behind the control plane's credential."""

    async def metrics(request: Request) -> Response:
        runtime.metrics.refresh(await pending_approvals(runtime))
        body, content_type = runtime.metrics.exposition()
        return Response(body, media_type=content_type)

    return Route("/metrics", auth.guard(metrics), methods=["GET"])


__all__ = ["health_routes", "metrics_route", "readiness"]
