"""The shared runtime state of ``drawbridge serve``, built once: one object of each kind, used by both
the calls and the control plane.

Invariant: the calls and the control plane act on the same objects. The ``PolicyStore`` the decider
evaluates is the one ``PUT /policies/...`` edits and reloads; the ``ApprovalEngine`` whose waiters a
call blocks on is the one ``POST /approvals/{id}/approve`` resolves; the pin store and the
``CataloguePins`` whose floors decide calls are the ones ``POST /tools/pins/accept`` changes (and the
floors are recomputed before the answer); the trace chain every call is recorded in is the one policy
edits, pin events and approvals are appended to. Nothing is copied, so nothing falls out of step.
And a trace entry that cannot be written makes the gateway refuse every later call, as a failed call
record does.

Theory of operation. ``open_state`` opens the SQLite state (approvals, grants, pins) before anything
starts; a file that cannot be opened is a startup error. ``build_runtime`` then assembles, in order:

* the trace appender (``recorder.record_event``), bound to the gateway once it exists;
* the approval engine (``gateway.approvals.build_approval_engine``, settings from ``approval:``);
* with ``pin_tools``: the ``SqlitePinStore`` and ``CataloguePins`` over the upstream sessions; the
  gateway awaits ``CataloguePins.check`` on every catalogue load (connect, reconnect, list_changed);
* the decider: policy, then the pin floor (``PinFlooredDecider``), then the approval gate
  (``gateway.approvals.approval_gate``), so a tool its pin holds at ``human_approval`` goes to a
  person; ``control_open`` says whether an operator channel (the control plane) can answer;
* with ``hide_denied_tools``: the per-agent ``tools/list`` filter (``policy.decisions.is_hidden``
  with each tool's floor), cached per agent until the policy set, the catalogue or the pins change;
  agents are told (``notifications/tools/list_changed``) after pins are accepted and after every
  policy reload (``announce_policy_changes``);
* the recorder, tapped so a ``RecentCallRing`` keeps each agent's latest decisions (no arguments);
* ``ControlServices`` with a catalogue provider reading the live merged catalogue, and
  ``control_routes`` behind the admin token (none configured: loopback callers only).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus
from starlette.routing import BaseRoute

from drawbridge.approval.engine import ApprovalEngine
from drawbridge.canonical import sanitize
from drawbridge.catalogue.classify import Classification
from drawbridge.catalogue.floors import NO_FLOOR, Floor
from drawbridge.config import GatewayConfig
from drawbridge.control import (
    CatalogueItem,
    ControlServices,
    HeldBackTool,
    RecentCallRing,
    StorePinService,
    control_routes,
)
from drawbridge.gateway.approvals import ApprovalSettings, approval_gate, build_approval_engine, run_approvals
from drawbridge.gateway.catalogue import Catalogue, CatalogueEntry
from drawbridge.gateway.hub import Gateway, GatewaySettings
from drawbridge.gateway.pinning import CataloguePins, PinFlooredDecider
from drawbridge.gateway.pipeline import CallRecord, Decider, PolicyDecider, Recorder, RelayEvent
from drawbridge.gateway.recorder import utc_now
from drawbridge.gateway.upstream_session import UpstreamSession
from drawbridge.policy.decisions import is_hidden
from drawbridge.policy.model import PolicySet
from drawbridge.state.pins import PinStoreUnavailable, SqlitePinStore
from drawbridge.state.sqlite import StateDB, StateUnavailable

logger = logging.getLogger("drawbridge.gateway")

FILTER_CACHE_AGENTS: Final = 1024


class StartupProblem(Exception):
    """A problem found while building the runtime: a startup error, printed as is."""


def open_state(config: GatewayConfig) -> StateDB:
    """The state database at ``config.state_path`` (created if missing); a startup error if unusable."""
    try:
        return StateDB.open(config.state_path)
    except StateUnavailable as exc:
        raise StartupProblem(f"{exc}; the gateway does not start without its state") from None
    except OSError as exc:
        raise StartupProblem(
            f"cannot open state database {config.state_path}: {exc.strerror or type(exc).__name__}"
        ) from None


class TraceAppender:
    """``(kind, body) -> entry``: one entry in the gateway's trace chain, for everything that is not a
    call record. A failure is raised to the caller and makes the gateway refuse later calls."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self.gateway: Gateway | None = None

    async def __call__(self, kind: str, body: Mapping[str, Any]) -> Any:
        try:
            entry = await self._recorder.record_event(kind, body)
            if entry is None:
                raise OSError("the gateway has no trace log to record in")
        except Exception:
            if self.gateway is not None:
                self.gateway.record_failed = True
            logger.error("a %s trace entry could not be written; later tools/call requests are refused", kind)
            raise
        return entry


POLICY_POLL_SECONDS: Final = 0.25
"""How often the policy generation is checked for ``announce_policy_changes``."""


class RecordingTap:
    """The gateway's recorder, plus a summary of each recorded call for ``recent_calls`` (no arguments)."""

    def __init__(self, recorder: Recorder, ring: RecentCallRing, clock: Callable[[], str] = utc_now) -> None:
        self._recorder = recorder
        self._ring = ring
        self._clock = clock

    async def __call__(self, event: RelayEvent, /) -> None:
        await self._recorder(event)
        self._note(event)

    @property
    def record_now(self) -> Callable[[Sequence[RelayEvent]], Awaitable[None] | None] | None:
        """The recorder's synchronous form, when it has one, noting each call as ``__call__`` does."""
        inner = getattr(self._recorder, "record_now", None)
        if not callable(inner):
            return None

        def record_now(events: Sequence[RelayEvent]) -> Awaitable[None] | None:
            rest = inner(events)
            for event in events:
                self._note(event)
            return rest

        return record_now

    def _note(self, event: RelayEvent) -> None:
        if isinstance(event, CallRecord) and event.tool is not None:
            provenance = event.provenance
            self._ring.add(
                event.agent,
                {
                    "tool": sanitize(event.tool),
                    "action": event.action.value if event.action is not None else None,
                    "outcome": event.outcome.value,
                    "policy": sanitize(provenance.policy) if provenance and provenance.policy else None,
                    "rule_index": provenance.rule_index if provenance else None,
                    "at": self._clock(),
                },
            )


@dataclass
class _Visible:
    policy_set: PolicySet
    catalogue: Catalogue
    revision: int
    names: frozenset[str]


class VisibleTools:
    """The ``hide_denied_tools`` filter: an agent's ``tools/list`` without the tools it could only be
    refused, every path through its policy ending in deny after the tool's floor."""

    def __init__(self, store: Any, floor: Callable[[CatalogueEntry], Floor], revision: Callable[[], int]) -> None:
        self._store = store
        self._floor = floor
        self._revision = revision
        self._cache: dict[str, _Visible] = {}

    def names(self, agent: str, catalogue: Catalogue) -> frozenset[str]:
        policy_set = self._store.current
        revision = self._revision()
        cached = self._cache.get(agent)
        if (
            cached is not None
            and cached.policy_set is policy_set
            and cached.catalogue is catalogue
            and cached.revision == revision
        ):
            return cached.names
        names = frozenset(
            entry.name
            for entry in catalogue.entries
            if not is_hidden(policy_set, agent, entry.name, self._floor(entry))
        )
        if len(self._cache) >= FILTER_CACHE_AGENTS:
            self._cache.clear()
        self._cache[agent] = _Visible(policy_set, catalogue, revision, names)
        return names

    def __call__(self, agent: str, catalogue: Catalogue) -> list[dict[str, Any]]:
        visible = self.names(agent, catalogue)
        return [dict(entry.item) for entry in catalogue.entries if entry.name in visible]


def upstream_tool(entry: CatalogueEntry) -> dict[str, Any]:
    """The upstream's own tool dict (its own name) of a catalogue entry."""
    tool = dict(entry.item)
    tool["name"] = entry.upstream_name
    return tool


class GatewayPinService(StorePinService):
    """``StorePinService`` that will not show an empty list for a server whose pins the gateway could
    not read: ``GET /tools/pins`` answers 503 naming the server (its tools are all held back)."""

    def __init__(self, store: SqlitePinStore, pins: CataloguePins, **options: Any) -> None:
        super().__init__(store, pins.servers, **options)
        self._pins = pins

    async def held_back(self) -> list[HeldBackTool]:
        for server in self.servers():
            state = self._pins.state(server)
            if state is not None and state.unavailable is not None:
                raise PinStoreUnavailable(server, "the gateway's last check of this server's catalogue failed")
        return await super().held_back()


@dataclass
class ServeRuntime:
    """Everything ``drawbridge serve`` shares between calls and the control plane (module docstring)."""

    config: GatewayConfig
    policy: PolicyDecider
    state_db: StateDB
    upstreams: list[UpstreamSession]
    gateway: Gateway
    engine: ApprovalEngine
    approval_settings: ApprovalSettings
    trace_append: TraceAppender
    recent: RecentCallRing
    pins: CataloguePins | None = None
    pin_store: SqlitePinStore | None = None
    visible: VisibleTools | None = None
    _classified: tuple[Catalogue | None, dict[str, Classification]] = field(
        default_factory=lambda: (None, {}), repr=False
    )

    # -- catalogue, as the control plane sees it ------------------------------------------------------

    def floor(self, entry: CatalogueEntry) -> Floor:
        if self.pins is None:
            return NO_FLOOR
        return self.pins.floor(entry.server, entry.upstream_name)

    def catalogue_items(self) -> list[CatalogueItem]:
        """Every served tool as a ``CatalogueItem``: the upstream's own dict, ``server.tool``, its pin status."""
        catalogue = self.gateway.tools
        cached_for, classified = self._classified
        if cached_for is not catalogue:
            classified = {}
            self._classified = (catalogue, classified)
        items: list[CatalogueItem] = []
        for entry in catalogue.entries:
            status = None if self.pins is None else self.pins.status(entry.server, entry.upstream_name)
            known = classified.get(entry.name)
            if known is None:
                item = CatalogueItem.of(entry.server, upstream_tool(entry), name=entry.name, pin_status=status)
                classified[entry.name] = item.classification
            else:
                item = CatalogueItem(
                    server=entry.server, tool=upstream_tool(entry), name=entry.name, classification=known,
                    pin_status=status,
                )
            items.append(item)
        return items

    async def announce_policy_changes(self, interval: float = POLICY_POLL_SECONDS) -> None:
        """Under ``hide_denied_tools``: after every successful policy reload (a file edited, a control
        plane edit), tell handshake-era agents that their tool list may differ. Runs until cancelled."""
        if self.visible is None:
            return
        seen = self.policy.store.generation
        while True:
            await anyio.sleep(interval)
            generation = self.policy.store.generation
            if generation != seen:
                seen = generation
                await self.gateway.tools_changed()

    async def after_accept(self, server: str) -> None:
        """Pins of ``server`` were accepted: recompute its floors now; agents that filter are told."""
        if self.pins is not None:
            await self.pins.after_accept(server)
        if self.visible is not None:
            await self.gateway.tools_changed()

    # -- lifecycle --------------------------------------------------------------------------------

    def control_services(self) -> ControlServices:
        pin_service = None
        if self.pin_store is not None and self.pins is not None:
            pin_service = GatewayPinService(self.pin_store, self.pins, after_accept=self.after_accept)
        return ControlServices(
            policy_store=self.policy.store,
            catalogue=self.catalogue_items,
            approvals=self.engine,
            trace_append=self.trace_append,
            pins=pin_service,
            recent_calls=self.recent,
        )

    def control_routes(self) -> list[BaseRoute]:
        """The control plane's routes, behind the admin token (none configured: loopback callers only)."""
        return list(control_routes(self.control_services(), admin_token_sha256=self.config.admin_token_sha256))

    async def run_approvals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start with ``tg.start`` before any call: approvals left pending by a previous process become
        expired (recorded), then due approvals are expired for as long as the gateway runs."""
        await run_approvals(self.engine, sweep_seconds=self.approval_settings.sweep_seconds, task_status=task_status)

    def close(self) -> None:
        self.state_db.close()


def build_runtime(
    config: GatewayConfig,
    *,
    policy: PolicyDecider,
    recorder: Recorder,
    state_db: StateDB,
    upstreams: Sequence[UpstreamSession],
    control_open: bool = True,
    settings: GatewaySettings | None = None,
) -> ServeRuntime:
    """Assemble the runtime (module docstring). Call inside the event loop that will run the gateway."""
    trace_append = TraceAppender(recorder)
    approval_settings = ApprovalSettings.from_config(config)
    engine = build_approval_engine(approval_settings, state_db, trace_append)
    pin_store: SqlitePinStore | None = None
    pins: CataloguePins | None = None
    decide: Decider = policy
    if config.pin_tools:
        pin_store = SqlitePinStore(state_db)
        pins = CataloguePins(pin_store, upstreams, trace_append)
        decide = PinFlooredDecider(decide, pins)
    # Floors before approvals: a tool held at human_approval by its pin goes to a person.
    decide = approval_gate(decide, engine, approval_settings, operator_channel=control_open)
    recent = RecentCallRing()

    def floor(entry: CatalogueEntry) -> Floor:
        return NO_FLOOR if pins is None else pins.floor(entry.server, entry.upstream_name)

    def revision() -> int:
        return 0 if pins is None else pins.revision

    visible = VisibleTools(policy.store, floor, revision) if config.hide_denied_tools else None

    async def on_catalogue(upstream: UpstreamSession) -> bool:
        assert pins is not None
        return await pins.check(upstream.name)

    gateway = Gateway(
        list(upstreams),
        decide=decide,
        record=RecordingTap(recorder, recent),
        settings=settings or GatewaySettings(call_timeout=config.call_timeout_seconds),
        on_catalogue=on_catalogue if pins is not None else None,
        tool_filter=visible,
    )
    trace_append.gateway = gateway
    runtime = ServeRuntime(
        config=config,
        policy=policy,
        state_db=state_db,
        upstreams=list(upstreams),
        gateway=gateway,
        engine=engine,
        approval_settings=approval_settings,
        trace_append=trace_append,
        recent=recent,
        pins=pins,
        pin_store=pin_store,
        visible=visible,
    )
    return runtime


__all__ = [
    "GatewayPinService",
    "RecordingTap",
    "StartupProblem",
    "ServeRuntime",
    "TraceAppender",
    "VisibleTools",
    "build_runtime",
    "open_state",
    "upstream_tool",
]
