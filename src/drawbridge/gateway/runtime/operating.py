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
served. When every call needs the state database (``rate_limits`` on PostgreSQL: each call takes a
token from the shared buckets), ``/readyz`` also pings it (``state_unavailable``) and answers 503 while
it cannot be reached, since every call would be refused ``state unavailable``. The ping's answer is
reused for ``STATE_PROBE_SECONDS`` and one ping runs at a time, so probes (which need no credential)
cannot load the database.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import anyio.to_thread

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drawbridge.control.auth import AdminAuth
from drawbridge.gateway.runtime.assembly import Runtime
from drawbridge.state.approvals import ApprovalStatus
from drawbridge.state.errors import StateUnavailable
from drawbridge.state.postgres import PostgresDB

UpstreamStates = Callable[[], Mapping[str, bool]]

STATE_PROBE_SECONDS: Final = 1.0
"""How long one ping of the state database answers ``/readyz`` for."""
STATE_PING_TIMEOUT: Final = 1.0
"""How long a ping waits for a connection before the state counts as unreachable."""


class StateProbe:
    """Whether the state database answers now: one ping at a time, its answer reused for a while."""

    def __init__(self, db: PostgresDB) -> None:
        self._db = db
        self._lock = anyio.Lock()
        self._at = float("-inf")
        self._reachable = True

    async def reachable(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._at >= STATE_PROBE_SECONDS:
                try:
                    await anyio.to_thread.run_sync(functools.partial(self._db.ping_sync, STATE_PING_TIMEOUT))
                    self._reachable = True
                except StateUnavailable:
                    self._reachable = False
                self._at = time.monotonic()
            return self._reachable


def state_probe(runtime: Runtime) -> StateProbe | None:
    """The probe ``/readyz`` asks when every call needs the state database (module docstring), else None."""
    db = runtime.state_db
    if isinstance(db, PostgresDB) and runtime.pipeline.rate_limits is not None:
        return StateProbe(db)
    return None


def readiness(
    runtime: Runtime, upstreams: UpstreamStates, state_reachable: bool | None = None
) -> tuple[bool, dict[str, Any]]:
    """Whether the gateway is ready, and the status fields ``/readyz`` shows (module docstring);
    ``state_reachable``: the state probe's answer, None when every call does not need the state."""
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
    if runtime.prompt_pins is not None:  # shown, not counted: a server's tools still serve without its prompts
        body["prompt_pins_unavailable"] = runtime.prompt_pins.unavailable()
    if state_reachable is not None:
        body["state_unavailable"] = not state_reachable
    serving = [name for name in states if name not in down and name not in unreadable]
    ready = evidence_ok and (not states or bool(serving)) and state_reachable is not False
    body["status"] = "ready" if ready else "not ready"
    return ready, body


def health_routes(runtime: Runtime, upstreams: UpstreamStates) -> list[Route]:
    """``/healthz`` and ``/readyz`` (module docstring), for the agents' listener."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    probe = state_probe(runtime)

    async def readyz(request: Request) -> Response:
        ready, body = readiness(runtime, upstreams, None if probe is None else await probe.reachable())
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
