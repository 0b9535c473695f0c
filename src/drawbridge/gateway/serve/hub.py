"""The hub between many agent connections and several upstreams: one ``Gateway`` per process.

Invariant: the ``Gateway`` is the only place where the two sides' id spaces meet, and every table that
maps between them is keyed so that nothing one agent sent or caused is ever attributed to another:
upstream request id -> (session, agent's request id), gateway progress token -> (session, agent's
token), (session, token of a relayed server request) -> upstream, resource URI -> upstream
(``resource_routes.py``), gateway task id -> (agent, upstream, upstream's task id) (``task_book.py``:
an agent reaches only its own tasks), and (upstream, URI) -> subscribers (``subscriptions.py``: agent connections
and listen streams; the upstream stays subscribed while anyone wants the URI, and is subscribed again
when it reconnects, ``upstream_subscriptions.py``). It also holds the merged tool catalogue, rebuilt
whenever an upstream's tool list changes, which is the call pipeline's ``Resolver`` under serve: every
tools/call is handed to the one ``CallPipeline`` (``pipeline.call``), which resolves it here and
forwards it through this upstream's ``UpstreamForwarder``; incidents go through the pipeline's
evidence guard.
Upstreams the gateway runs itself (OpenAPI services, CLI binaries: ``upstreams.local``) join the same
merged catalogue under their own names, and are the forwarder of their own tools; they offer nothing
but tools, so every other table here is the MCP upstreams' alone.
Two optional hooks serve the catalogue features of ``drawbridge serve``: ``on_catalogue`` is awaited on
every catalogue load of an upstream before the merged list is rebuilt (pinning checks the new tools
there), ``listing_view`` shows each held-back tool as the version a person accepted (``pin_tools``),
and ``tool_filter`` gives each agent its own ``tools/list`` (``hide_denied_tools``); none changes what
is decided on a call.

Theory of operation. The gateway runs every ``UpstreamSession`` and is their listener. Messages from an
upstream are routed here: progress notifications go back by token; list-changed notifications are
broadcast to handshake-era sessions and published to the 2026-07-28 ``subscriptions/listen`` streams
that asked for them (``listen_streams.py``; tools: once the merged list has actually changed);
resource updates go to the sessions and listen streams that subscribed; task status notifications, and
every message marked as about a task, to the session whose call created the task, or nobody
(``task_book.py``); other notifications and server
requests go to the request they belong to when the upstream says so (HTTP: the SSE stream of one of
our POSTs), else to the one session with requests in flight on that upstream (notifications: each such
session, or every session when none has). A server request that cannot be attributed to exactly one
agent is refused rather than guessed, and ``roots/list`` is refused outright (the shared session
declares no roots). Everything an agent sends is handled by its ``AgentSession``
(``downstream_session.py``, with the method handlers that ``routes.py`` names).
"""

from __future__ import annotations

import dataclasses

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from drawbridge.catalogue.merged import Catalogue, CatalogueEntry, build_catalogue
from drawbridge.gateway.pipeline.call import CallPipeline, Flight, Forwarder, Resolved
from drawbridge.gateway.pipeline.floors import Route, route_of
from drawbridge.gateway.protocol.hop import (
    combined_instructions,
    progress_token,
    union_capabilities,
    valid_token,
)
from drawbridge.gateway.protocol.jsonrpc import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    MessageError,
    RequestId,
)
from drawbridge.gateway.protocol.methods import (
    PROGRESS,
    PROMPTS_LIST_CHANGED,
    RESOURCE_UPDATED,
    RESOURCES_LIST_CHANGED,
    ROOTS_LIST,
    TOOLS_LIST_CHANGED,
)
from drawbridge.gateway.protocol.tasks import TASK_STATUS, TASKS_CANCEL, related_renamed, related_task_id, task_only
from drawbridge.gateway.serve.agents import UNATTRIBUTABLE, AgentSession, NoBackChannel
from drawbridge.gateway.serve.forwarding import UpstreamForwarder
from drawbridge.gateway.serve.task_book import HeldTask, TaskBook
from drawbridge.gateway.serve.listen_streams import ListenStreams
from drawbridge.gateway.serve.resource_routes import ResourceRoutes
from drawbridge.gateway.serve.upstream_subscriptions import UpstreamSubscriptions
from drawbridge.gateway.upstreams.local import LocalUpstream
from drawbridge.gateway.upstreams.requests import PendingCall, UpstreamLost, UpstreamUnavailable
from drawbridge.gateway.upstreams.session import State, UpstreamSession

logger = logging.getLogger("drawbridge.gateway")

CatalogueHook = Callable[[UpstreamSession | LocalUpstream], Awaitable[bool]]
"""Awaited on every catalogue load of an upstream, before the merged list is rebuilt; True when the
floors of that upstream's tools changed (pin statuses)."""
ToolFilter = Callable[[str, Catalogue], list[dict[str, Any]]]
"""``(agent, catalogue) -> the tools/list items that agent sees``."""
ListingView = Callable[[Catalogue], Catalogue]
"""The catalogue as agents are shown it (``pin_tools``: ``serve.pinned_listing``); calls resolve in the whole one."""


@dataclass(frozen=True)
class GatewaySettings:
    call_timeout: float = 120.0
    """Seconds a relayed request that is not a tools/call may wait for its upstream (the pipeline
    times tools/call with the same setting)."""


@dataclass(frozen=True, slots=True)
class _Forward:
    session: AgentSession
    request_id: RequestId


@dataclass(frozen=True, slots=True)
class _ProgressRoute:
    session: AgentSession
    token: str | int
    request_id: RequestId


class Gateway:
    def __init__(
        self,
        upstreams: Sequence[UpstreamSession],
        *,
        pipeline: CallPipeline,
        settings: GatewaySettings | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_catalogue: CatalogueHook | None = None,
        tool_filter: ToolFilter | None = None,
        listing_view: ListingView | None = None,
        local: Sequence[LocalUpstream] = (),
    ) -> None:
        self.upstreams: dict[str, UpstreamSession] = {}
        for upstream in upstreams:
            if upstream.name in self.upstreams:
                raise ValueError(f"duplicate upstream name {upstream.name!r}")
            self.upstreams[upstream.name] = upstream
            upstream.listener = self
        self.local: dict[str, LocalUpstream] = {}
        """Upstreams the gateway runs itself (OpenAPI, CLI), in configuration order."""
        for kind in local:
            if kind.name in self.upstreams or kind.name in self.local:
                raise ValueError(f"duplicate upstream name {kind.name!r}")
            self.local[kind.name] = kind
            kind.attach(pipeline)
        self.settings = settings or GatewaySettings(call_timeout=pipeline.call_timeout)
        self.clock = clock
        self.pipeline = pipeline
        self.guard = pipeline.guard
        self._forwarders: dict[str, Forwarder] = {
            name: UpstreamForwarder(self, u, pipeline) for name, u in self.upstreams.items()
        }
        self._forwarders.update(self.local)
        self.tools: Catalogue = build_catalogue([])
        self._routes: dict[str, Resolved] = {}
        """The route of every served name, made when the catalogue is (``route_of`` classifies)."""
        self._task_only: frozenset[str] = frozenset()
        """The served names of the tools that run only as tasks (``protocol.tasks.task_only``)."""
        self.sessions: set[AgentSession] = set()
        self._inflight: dict[tuple[str, int], _Forward] = {}
        self._progress: dict[tuple[str, str], _ProgressRoute] = {}
        self._client_progress: dict[tuple[AgentSession, str | int], UpstreamSession] = {}
        self._next_token = 0
        self.resources = ResourceRoutes(self.upstreams)
        self.subscriptions = UpstreamSubscriptions(self.upstreams, call_timeout=self.settings.call_timeout)
        self.listen_streams = ListenStreams(on_end=self._release)
        self.task_book = TaskBook(self.guard.append, on_end=self._task_ended)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._local_checked: list[anyio.Event] = []
        """Set when each local upstream's first catalogue check ended (``wait_settled`` waits for them)."""
        self._reported_problems: set[str] = set()
        self._on_catalogue = on_catalogue
        self._tool_filter = tool_filter
        self._listing_view = listing_view

    # ------------------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every upstream session (connect, reconnect) until cancelled; started at once. The call
        pipeline runs with them unless its owner started it already."""
        try:
            async with anyio.create_task_group() as tg:
                if not self.pipeline.running:
                    await tg.start(self.pipeline.run)
                self._tasks = tg
                for kind in self.local.values():
                    await tg.start(kind.run)
                self.rebuild_catalogue()
                self._local_checked = [anyio.Event() for _ in self.local]
                for kind, checked in zip(self.local.values(), self._local_checked, strict=True):
                    tg.start_soon(self._first_catalogue, kind, checked)
                for upstream in self.upstreams.values():
                    tg.start_soon(upstream.run)
                task_status.started()
        finally:
            self._tasks = None
            with anyio.CancelScope(shield=True):
                for session in list(self.sessions):
                    await session.close()

    async def _first_catalogue(self, kind: LocalUpstream, checked: anyio.Event) -> None:
        """A local upstream's catalogue, checked once (the pins' check) in the background."""
        try:
            await self.upstream_catalogue(kind, True)
        finally:
            checked.set()

    async def wait_settled(self, timeout: float) -> None:
        """Wait until every upstream's first connection attempt ended and every local upstream's first
        catalogue check did (or ``timeout`` seconds): serve answers agents only then, so a session that
        lists the tools and leaves at once still finds the check's records (``mesh.pin_held_back``)
        in the trace, as for an MCP upstream, whose check runs before it is ready."""
        with anyio.move_on_after(timeout):
            for upstream in self.upstreams.values():
                await upstream.wait_settled()
            for checked in self._local_checked:
                await checked.wait()

    def start_errors(self) -> list[str]:
        return [u.unavailable_reason() for u in self.upstreams.values() if u.start_error is not None]

    async def close(self) -> None:
        self.listen_streams.unlisten_all()
        for session in list(self.sessions):
            await session.close()
        for upstream in self.upstreams.values():
            await upstream.close()
        for kind in self.local.values():
            await kind.close()

    def forget_session(self, session: AgentSession) -> None:
        self.sessions.discard(session)
        for key in [k for k, route in self._progress.items() if route.session is session]:
            del self._progress[key]
        for key in [k for k in self._client_progress if k[0] is session]:
            del self._client_progress[key]
        self._release(session)

    def _release(self, subscriber: object) -> None:
        """A subscriber is gone (its connection or listen stream ended): the upstreams are
        unsubscribed from what nobody wants any more, in the background."""
        for key in self.subscriptions.book.drop_all(subscriber):
            if self._tasks is not None:
                self._tasks.start_soon(self.subscriptions.unsubscribe_unwanted, key)

    # ------------------------------------------------------------------------------ catalogue

    def capabilities(self, *, tasks: bool = False) -> dict[str, Any]:
        """What the gateway declares; ``tasks`` for a 2025-11-25 session (``protocol.tasks``)."""
        return union_capabilities([u.capabilities for u in self.upstreams.values() if u.capabilities], tasks=tasks)

    def instructions(self) -> str | None:
        return combined_instructions([(u.name, u.instructions) for u in self.upstreams.values()])

    def listing_for(self, agent: str) -> list[dict[str, Any]]:
        """The tools/list an agent receives: the merged catalogue, filtered for it when a filter is set
        (``hide_denied_tools``). A filter that fails answers the request with an error, never a guess."""
        tools = self.tools if self._listing_view is None else self._listing_view(self.tools)
        if self._tool_filter is None:
            return tools.listing()
        try:
            return self._tool_filter(agent, tools)
        except Exception as exc:  # noqa: BLE001 -- the agent gets an error, not an unfiltered list
            logger.error("filtering the tool list for an agent failed (%s)", type(exc).__name__)
            raise MessageError(INTERNAL_ERROR, "the tool list could not be filtered for this agent") from None

    async def tools_changed(self) -> None:
        """Tell agents their tool list may differ (pins accepted, floors changed, a policy reload)."""
        await self.broadcast({"jsonrpc": "2.0", "method": TOOLS_LIST_CHANGED})

    def rebuild_catalogue(self) -> bool:
        """Merge the upstreams' tool lists again; True when what agents see has changed."""
        sources = [(u.name, u.tools) for u in self.upstreams.values()]
        sources += [(kind.name, kind.tools) for kind in self.local.values()]
        catalogue = build_catalogue(sources, "tool")
        changed = catalogue.listing() != self.tools.listing()
        self.tools = catalogue
        self._routes = {entry.name: Resolved(self.route(entry), self._forwarders[entry.server]) for entry in catalogue.entries}
        self._task_only = frozenset(entry.name for entry in catalogue.entries if task_only(entry.item))
        return changed

    def runs_only_as_task(self, tool: Any) -> bool:
        """Whether the served tool of this name refuses a call that is not a task: one a 2026-07-28
        agent neither sees nor may call (``protocol.tasks``)."""
        return isinstance(tool, str) and tool in self._task_only

    # -------------------------------------------------------------------------- upstream events

    async def upstream_catalogue(self, upstream: UpstreamSession | LocalUpstream, changed: bool) -> None:
        # The catalogue hook (pinning) runs first, so the floors of a new catalogue are computed
        # before agents are told about it; until then its calls wait for the check or are held back.
        floors_changed = False
        if self._on_catalogue is not None:
            try:
                floors_changed = bool(await self._on_catalogue(upstream))
            except Exception as exc:  # noqa: BLE001 -- the hook fails closed on its own; keep serving
                logger.error("the catalogue hook failed for upstream %r (%s)", upstream.name, type(exc).__name__)
        listing_changed = self.rebuild_catalogue()
        if listing_changed:
            for problem in self.tools.problems:
                text = problem.describe()
                if text not in self._reported_problems:
                    self._reported_problems.add(text)
                    await self.incident("catalogue_refused", "upstream", f"not served: {text}")
        per_floor = self._tool_filter is not None or self._listing_view is not None
        if listing_changed or (floors_changed and per_floor):
            await self.tools_changed()

    async def upstream_state(self, upstream: UpstreamSession) -> None:
        if upstream.state in (State.RECONNECTING, State.FAILED):
            # A first start that failed stops serve, which says why in its one startup line: recorded, not logged.
            await self.incident(
                "upstream_exited", "upstream", upstream.unavailable_reason(), log=upstream.state is not State.FAILED
            )
        elif upstream.state is State.READY and upstream.generation > 1 and self._tasks is not None:
            # A new connection knows no subscription: ask again for what is still wanted.
            self._tasks.start_soon(self.subscriptions.resubscribe, upstream)

    async def upstream_notification(self, upstream: UpstreamSession, message: dict[str, Any], related: int | None) -> None:
        method = message.get("method")
        params = message.get("params")
        if method == PROGRESS:
            token = params.get("progressToken") if isinstance(params, dict) else None
            route = self._progress.get((upstream.name, token)) if isinstance(token, str) else None
            if route is not None:
                assert isinstance(params, dict)
                await route.session.emit(
                    {"jsonrpc": "2.0", "method": method, "params": {**params, "progressToken": route.token}},
                    route.request_id,
                )
            return
        if method in (RESOURCES_LIST_CHANGED, PROMPTS_LIST_CHANGED):
            if method == RESOURCES_LIST_CHANGED:
                self.resources.forget_resources(upstream.name)
            await self.broadcast(message)
            return
        if method == TASK_STATUS:
            await self.task_book.status(upstream.name, params)
            return
        task_id = related_task_id(params)
        if task_id is not None:  # about a task: its agent's, or nobody's
            held = self.task_book.by_upstream(upstream.name, task_id)
            if held is not None:
                await held.session.emit({**message, "params": related_renamed(params, held.task_id)}, None)
            return
        if method == RESOURCE_UPDATED:
            uri = params.get("uri") if isinstance(params, dict) else None
            book = self.subscriptions.book
            subscribers = book.subscribers(upstream.name, uri) if isinstance(uri, str) else []
            for subscriber in subscribers:
                if subscriber in self.listen_streams:
                    self.listen_streams.deliver(subscriber, (method, {"uri": uri}))
                else:  # an agent connection
                    await cast(AgentSession, subscriber).emit(message, None)
            return
        for session, request_id in self._targets(upstream, related):
            await session.emit(message, request_id)

    async def upstream_request(self, upstream: UpstreamSession, message: dict[str, Any], related: int | None) -> dict[str, Any]:
        method = message.get("method")
        if method == ROOTS_LIST:
            return {"error": {"code": METHOD_NOT_FOUND, "message": "the gateway does not relay roots"}}
        params = message.get("params")
        task_id = related_task_id(params)
        if task_id is not None:  # about a task: its agent's, or nobody's
            held = self.task_book.by_upstream(upstream.name, task_id)
            targets: list[tuple[AgentSession, RequestId | None]] = [(held.session, None)] if held is not None else []
            params = related_renamed(params, held.task_id) if held is not None else params
        else:
            targets = self._targets(upstream, related, for_request=True)
        if len(targets) != 1:
            return {"error": {"code": INTERNAL_ERROR, "message": UNATTRIBUTABLE}}
        session, request_id = targets[0]
        token = progress_token(params)
        if token is not None:
            self._client_progress[(session, token)] = upstream
        try:
            return await session.request(str(method), params if isinstance(params, dict) else None, request_id)
        except NoBackChannel:
            return {
                "error": {
                    "code": INTERNAL_ERROR,
                    "message": "the agent's connection cannot take requests from the server",
                }
            }
        finally:
            if token is not None:
                self._client_progress.pop((session, token), None)

    def _targets(
        self, upstream: UpstreamSession, related: int | None, *, for_request: bool = False
    ) -> list[tuple[AgentSession, RequestId | None]]:
        """Which agent connections a message from ``upstream`` is for (see the module docstring)."""
        if related is not None:
            # It came on the stream of one of our requests: that request's agent, or nobody (the
            # request was the gateway's own, like a catalogue reload, or is already answered).
            forward = self._inflight.get((upstream.name, related))
            return [(forward.session, forward.request_id)] if forward is not None else []
        inflight = [f for (name, _), f in self._inflight.items() if name == upstream.name]
        sessions = {f.session for f in inflight}
        if len(inflight) == 1:
            return [(inflight[0].session, inflight[0].request_id)]
        if sessions:
            return [(session, None) for session in sessions] if not for_request or len(sessions) == 1 else []
        if for_request:
            return []
        return [(session, None) for session in self.sessions]

    async def broadcast(self, message: dict[str, Any]) -> None:
        """A list_changed notification to every agent: handshake-era sessions directly, 2026-07-28
        agents on the ``subscriptions/listen`` streams that asked for it."""
        for session in list(self.sessions):
            if session.initialized and not session.modern:
                await session.emit(message, None)
        method = message.get("method")
        if isinstance(method, str):
            self.listen_streams.publish(method)

    # -------------------------------------------------------------------------- id bookkeeping

    def track(self, upstream: UpstreamSession, call: PendingCall, session: AgentSession, request_id: RequestId) -> None:
        self._inflight[(upstream.name, call.id)] = _Forward(session, request_id)

    def untrack(self, upstream: UpstreamSession, call: PendingCall) -> None:
        self._inflight.pop((upstream.name, call.id), None)

    def new_progress_route(
        self, upstream: UpstreamSession, session: AgentSession, token: str | int, request_id: RequestId
    ) -> str:
        self._next_token += 1
        gateway_token = f"drawbridge-{self._next_token}"
        self._progress[(upstream.name, gateway_token)] = _ProgressRoute(session, token, request_id)
        return gateway_token

    def drop_progress_route(self, upstream: UpstreamSession, gateway_token: str) -> None:
        self._progress.pop((upstream.name, gateway_token), None)

    def hold_task(
        self, upstream: UpstreamSession, session: AgentSession, flight: Flight, upstream_task_id: str, progress: str | None
    ) -> HeldTask:
        call = flight.call
        assert call is not None
        return self.task_book.hold(
            agent=session.agent, upstream=upstream.name, upstream_task_id=upstream_task_id, tool=call.tool,
            request_id=flight.request_id, session=session, progress=progress,
        )

    def _task_ended(self, held: HeldTask) -> None:
        if held.progress is not None:
            self._progress.pop((held.upstream, held.progress), None)

    def drop_task(self, held: HeldTask) -> None:
        """A task created for a call that had already ended: forgotten, and cancelled upstream in the
        background (no agent knows its id)."""
        self.task_book.forget(held)
        upstream = self.upstreams.get(held.upstream)
        if self._tasks is not None and upstream is not None:
            self._tasks.start_soon(self._cancel_task, upstream, held.upstream_task_id)

    async def _cancel_task(self, upstream: UpstreamSession, upstream_task_id: str) -> None:
        try:
            call = await upstream.send_request(TASKS_CANCEL, {"taskId": upstream_task_id})
            with anyio.move_on_after(self.settings.call_timeout):
                await call.wait()
        except (UpstreamLost, UpstreamUnavailable):
            pass

    def client_progress_upstream(self, session: AgentSession, token: Any) -> UpstreamSession | None:
        return self._client_progress.get((session, token)) if valid_token(token) else None

    # ------------------------------------------------------------------- the pipeline's Resolver

    def route(self, entry: CatalogueEntry) -> Route:
        """Where a catalogue entry's calls go, with what the floors read of it (a CLI dispatcher) and
        what approval memory reads of it (a generic tool); made once per catalogue for the calls."""
        classified = route_of(entry.server, entry.upstream_name, entry.item)
        kind = self.local.get(entry.server)
        if kind is not None:
            local = kind.route(entry.upstream_name)
            return dataclasses.replace(local, generic=classified.generic or local.generic)
        return classified

    def resolve_now(self, tool: str) -> Resolved | None:
        """The route of a served (namespaced) tool name, or None: the merged catalogue is always known."""
        return self._routes.get(tool)

    async def resolve(self, tool: str) -> Resolved | None:
        return self.resolve_now(tool)

    # ---------------------------------------------------------------------------------- evidence

    @property
    def record_failed(self) -> bool:
        return self.guard.failed

    async def upstream_dropped(self, upstream: UpstreamSession, kind: str, detail: str, log: bool) -> None:
        await self.incident(kind, "upstream", detail, log=log)

    async def incident(self, kind: str, direction: str, detail: str, code: int | None = None, *, log: bool = True,
                       agent: str | None = None) -> None:
        await self.guard.incident(kind, direction, detail, code, log=log, agent=agent)
