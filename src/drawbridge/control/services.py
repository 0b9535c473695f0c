"""What the control plane needs from the running gateway, as one value the gateway fills in.

Invariant: the control plane holds no state of its own. Every answer is read from, and every change
is made through, the services below, which are the same objects the gateway decides calls with: the
``PolicyStore`` whose set the pipeline evaluates, the approval engine whose waiters a resolution
wakes, the pin store the catalogue floors come from. So a change made here is the change in force,
with no copy to fall out of step.

Theory of operation. ``ControlServices`` bundles:

* ``policy_store``: the hot-reloaded policy set (``drawbridge.state.policy_store.PolicyStore``);
  per-tool edits go through ``state.policy_edits``, which reloads the store itself.
* ``catalogue``: a callable (sync or async) returning the tools the gateway serves now, one
  ``CatalogueItem`` per tool: the upstream's own tool dict, the name agents see, the classification,
  the pin status (None when pinning is off) and the CLI dispatcher facts. The gateway computes pin
  statuses when it (re)connects an upstream; the control plane only reads them.
* ``approvals``: an ``ApprovalDesk``, which the gateway's approval engine is: its ``store`` lists and
  reads approvals, ``resolve`` is every channel's one way to answer one, ``shown_arguments`` gives
  what a person is shown of a pending call's arguments (held in the gateway's memory only), and its
  ``grant_service`` creates, lists and revokes grants.
* ``trace_append(kind, body)``: appends one entry to the gateway's hash-chained trace (async);
  ``mesh.policy_edit`` and ``mesh.pin_accept`` are written through it.
* ``read_json(body)``: the one strict reading of a request body the gateway holds agents' messages
  to (``gateway.protocol.jsonrpc.parse_one_reading``: a repeated key, keys equal but for case, ...
  refused); it raises ``ValueError`` naming the rule broken, never the content. The control plane
  imports nothing of the gateway's, so the gateway hands it in.
* ``pins``: a ``PinService`` (None when ``pin_tools`` is off). ``StorePinService`` implements it on
  the pin store: held-back tools are the observed tools whose fingerprint differs from the
  accepted one; accepting pins what was observed (only what was reviewed, given ``reviewed``
  fingerprints) and returns one ``PinAcceptance`` per change. "Observed" is what this gateway's own
  server offers when the gateway has listed it (replicas on PostgreSQL share one observation row per
  server, written by whichever replica checked last).
  ``prompt_pins`` is the same on the prompt pin store (``pin_prompts``); every held-back item says
  its ``kind``.
* ``recent_calls(agent, limit)``: the agent's latest decisions for the approval detail view (async,
  optional). ``RecentCallRing`` is a bounded in-memory implementation the recorder can feed.
* ``clock``: "now" for remaining times in views.
* ``shadow()``: the shadow policy's tally of the recorded calls (``GET /shadow``), or None without one.
* ``checkpoint()``: a signed checkpoint of the trace covering every line written so far (async), for
  auditors to keep a copy the operator cannot rewrite; None when the gateway writes no trace.
"""

from __future__ import annotations

import inspect
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from drawbridge.approval.shown_arguments import ShownArguments
from drawbridge.catalogue.classify import Classification, classify_tool
from drawbridge.catalogue.decisions import CatalogueTool
from drawbridge.catalogue.fingerprint import PinStatus
from drawbridge.policy.model import Action
from drawbridge.state.approvals import Approval, ApprovalStore
from drawbridge.state.pins import ObservedTool, PinAcceptance, PinStore, ToolDefinition
from drawbridge.state.policy_store import PolicyStore

PIN_ACCEPT_KIND: Final = "mesh.pin_accept"

TraceAppend = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
"""Append one trace-chain entry ``(kind, body)``; returns the entry written (a dict with ``seq``)."""
RecentCalls = Callable[[str, int], Awaitable[Sequence[Mapping[str, Any]]]]
Clock = Callable[[], datetime]
JsonReader = Callable[[bytes], Any]
"""A request body's JSON value; ``ValueError`` naming the rule broken when it has no one reading."""


def utc_clock() -> datetime:
    return datetime.now(UTC)


def agent_visible_name(server: str, name: str) -> str:
    """``server.name``: how ``drawbridge serve`` names an upstream tool (catalogue/names.py)."""
    return f"{server}.{name}"


@dataclass(frozen=True, slots=True)
class CatalogueItem:
    """One tool the gateway serves, as the control plane shows and judges it."""

    server: str
    tool: Mapping[str, Any]
    """The upstream's own tool dict (its own ``name``), as listed; never the gateway's config."""
    name: str
    """The name agents see and policies match (``server.tool`` under ``drawbridge serve``)."""
    classification: Classification
    pin_status: PinStatus | None = None
    dispatcher: bool = False
    dispatcher_default_action: Action | None = None
    source: str = "mcp"
    pin_reason: str | None = None
    """Why the tool is held back when its pin status alone does not say (catalogue not checked yet,
    pins unavailable): what a call gets, so that the decision view says the same."""

    @classmethod
    def of(
        cls,
        server: str,
        tool: Mapping[str, Any],
        *,
        name: str | None = None,
        pin_status: PinStatus | None = None,
        source: str = "mcp",
        dispatcher: bool = False,
        dispatcher_default_action: Action | None = None,
        openapi_method: str | None = None,
        free_arguments: bool = False,
        pin_reason: str | None = None,
    ) -> CatalogueItem:
        """Classify ``tool`` and name it ``server.<its name>`` unless ``name`` is given; an OpenAPI
        operation is classified by its HTTP method too (``openapi_method``), a CLI command by whether
        its arguments are free (``free_arguments``: no ``allowed_args``)."""
        upstream_name = tool.get("name")
        if not isinstance(upstream_name, str) or not upstream_name:
            raise ValueError("a tool needs a non-empty string name")
        classification = classify_tool(
            tool,
            source=source,  # type: ignore[arg-type]
            cli_dispatcher=dispatcher and source == "cli",
            cli_free_arguments=free_arguments and source == "cli",
            openapi_method=openapi_method if source == "openapi" else None,
        )
        return cls(
            server=server,
            tool=tool,
            name=name if name is not None else agent_visible_name(server, upstream_name),
            classification=classification,
            pin_status=pin_status,
            dispatcher=dispatcher,
            dispatcher_default_action=dispatcher_default_action,
            source=source,
            pin_reason=pin_reason,
        )

    @property
    def upstream_name(self) -> str:
        name = self.tool.get("name")
        return name if isinstance(name, str) else self.name

    def catalogue_tool(self) -> CatalogueTool:
        """The row input of ``catalogue.decisions.decision_table``."""
        return CatalogueTool(
            name=self.name,
            classification=self.classification,
            pin_status=self.pin_status,
            dispatcher=self.dispatcher,
            dispatcher_default_action=self.dispatcher_default_action if self.dispatcher else None,
            pin_reason=self.pin_reason,
        )


CatalogueProvider = Callable[[], "Sequence[CatalogueItem] | Awaitable[Sequence[CatalogueItem]]"]


async def current_catalogue(provider: CatalogueProvider) -> list[CatalogueItem]:
    """Call a sync or async provider; the items are checked so a wiring mistake is loud."""
    result = provider()
    if inspect.isawaitable(result):
        result = await result
    items = list(result)
    for item in items:
        if not isinstance(item, CatalogueItem):
            raise TypeError(f"the catalogue provider returned {type(item).__name__}, not CatalogueItem")
    return items


# ------------------------------------------------------------------------------------------- pins


@dataclass(frozen=True, slots=True)
class HeldBackTool:
    """A tool whose current definition is not the accepted one: ``new`` (no pin) or ``changed``."""

    server: str
    tool: str
    """The upstream's own name (the pin store's key)."""
    name: str
    """The name agents see."""
    status: PinStatus | str
    """``new`` or ``changed``; or ``unpinnable``: offered, but as nothing an accept can pin (``reason``)."""
    pinned_fingerprint: str | None
    pinned_description: str | None
    current_fingerprint: str | None
    current_description: str | None
    pinned_definition: str | None = None
    """The pinned definition's JCS text (None: not pinned, or pinned before the store kept it)."""
    current_definition: str | None = None
    """The definition observed now, as JCS text (None when the observation predates it)."""
    kind: str = "tool"
    """``tool``, or ``prompt`` (``pin_prompts``): then ``tool`` holds the prompt's own name."""
    reason: str | None = None
    """Why an ``unpinnable`` item cannot be accepted as offered (listed twice, no fingerprint)."""

    def as_dict(self) -> dict[str, Any]:
        shown = {"reason": self.reason} if self.reason is not None else {}
        return {
            "name": self.name,
            "kind": self.kind,
            "server": self.server,
            self.kind: self.tool,
            "status": self.status.value if isinstance(self.status, PinStatus) else self.status,
            **shown,
            "pinned": None
            if self.pinned_fingerprint is None
            else {
                "fingerprint": self.pinned_fingerprint,
                "description": self.pinned_description,
                "definition": _definition(self.pinned_definition),
            },
            "current": {
                "fingerprint": self.current_fingerprint,
                "description": self.current_description,
                "definition": _definition(self.current_definition),
            },
        }


def _definition(text: str | None) -> Any:
    """A stored definition (the JCS text its fingerprint covers) as JSON, None when not kept."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


class PinService(Protocol):
    """Held-back tools and accepting them (``GET /tools/pins``, ``POST /tools/pins/accept``)."""

    def servers(self) -> Sequence[str]: ...

    def display_name(self, server: str, tool: str) -> str: ...

    async def held_back(self) -> list[HeldBackTool]: ...

    async def accept(
        self,
        server: str,
        names: Sequence[str] | None,
        *,
        by: str,
        reviewed: Mapping[str, str | None] | None = None,
        dry_run: bool = False,
    ) -> list[PinAcceptance]: ...


class StorePinService:
    """``PinService`` on a ``state.pins.PinStore`` (the embedded SQLite one in practice).

    ``servers`` names the upstreams whose pins are shown (the configured ones). ``after_accept``
    is awaited with the server's name after pins changed, so the gateway can recompute the floors
    of that server's tools at once. ``offered`` gives what this gateway's own server offers now (None
    when it has not listed it): the held-back tools are shown, and an accept pins, from that rather
    than from the shared observation, which on PostgreSQL is whichever replica observed last.
    """

    def __init__(
        self,
        store: PinStore,
        servers: Callable[[], Iterable[str]],
        *,
        clock: Clock = utc_clock,
        display_name: Callable[[str, str], str] = agent_visible_name,
        after_accept: Callable[[str], Awaitable[None]] | None = None,
        offered: Callable[[str], Mapping[str, ToolDefinition] | None] | None = None,
        unpinnable: Callable[[str], Mapping[str, str]] | None = None,
    ) -> None:
        self._store = store
        self._unpinnable = unpinnable
        """What the server offers that cannot be pinned, and why: listed as such, never "removed"."""
        self._servers = servers
        self._clock = clock
        self._display = display_name
        self._after_accept = after_accept
        self._offered = offered
        self.kind: str = getattr(store, "kind", "tool")
        """What this service shows and accepts: the store's kind (``tool`` or ``prompt``)."""

    def _unpinnable_of(self, server: str) -> Mapping[str, str]:
        return {} if self._unpinnable is None else self._unpinnable(server)

    def _own(self, server: str) -> Mapping[str, ToolDefinition] | None:
        return None if self._offered is None else self._offered(server)

    async def _current(self, server: str) -> Mapping[str, ToolDefinition | ObservedTool]:
        own = self._own(server)
        return own if own is not None else await self._store.observed(server)

    def servers(self) -> Sequence[str]:
        return list(self._servers())

    def display_name(self, server: str, tool: str) -> str:
        return self._display(server, tool)

    async def held_back(self) -> list[HeldBackTool]:
        out: list[HeldBackTool] = []
        for server in self.servers():
            if not await self._store.is_pinned(server):
                continue  # never pinned: the gateway pins it whole on first sight
            pins = await self._store.load(server)
            observed = await self._current(server)
            for name in sorted(observed):
                seen = observed[name]
                pin = pins.get(name)
                if pin is not None and pin.fingerprint == seen.fingerprint:
                    continue
                out.append(
                    HeldBackTool(
                        server=server,
                        tool=name,
                        name=self._display(server, name),
                        status=PinStatus.NEW if pin is None else PinStatus.CHANGED,
                        pinned_fingerprint=None if pin is None else pin.fingerprint,
                        pinned_description=None if pin is None else pin.description,
                        current_fingerprint=seen.fingerprint,
                        current_description=seen.description,
                        pinned_definition=None if pin is None else pin.definition,
                        current_definition=seen.definition,
                        kind=self.kind,
                    )
                )
            for name, reason in sorted(self._unpinnable_of(server).items()):
                pin = pins.get(name)
                out.append(
                    HeldBackTool(
                        server=server, tool=name, name=self._display(server, name), status="unpinnable",
                        pinned_fingerprint=None if pin is None else pin.fingerprint,
                        pinned_description=None if pin is None else pin.description,
                        current_fingerprint=None, current_description=None,
                        pinned_definition=None if pin is None else pin.definition,
                        kind=self.kind, reason=f"cannot be accepted as offered: {reason}",
                    )
                )
        return out

    async def accept(
        self,
        server: str,
        names: Sequence[str] | None,
        *,
        by: str,
        reviewed: Mapping[str, str | None] | None = None,
        dry_run: bool = False,
    ) -> list[PinAcceptance]:
        changes = await self._store.accept(
            server, names, accepted_by=by, at=self._clock(), reviewed=reviewed, offered=self._own(server),
            dry_run=dry_run, unpinnable=self._unpinnable_of(server),
        )
        if changes and not dry_run and self._after_accept is not None:
            await self._after_accept(server)
        return changes


# ------------------------------------------------------------------------------------ recent calls


class RecentCallRing:
    """The last ``per_agent`` decisions of each agent, in memory (newest first when read).

    The gateway's recorder ``add``s a small summary per decided call (tool, action, rule, at: no
    argument values); ``GET /approvals/{id}`` shows the approval's agent's latest ones.
    """

    def __init__(self, per_agent: int = 20, max_agents: int = 1024) -> None:
        self._per_agent = per_agent
        self._max_agents = max_agents
        self._calls: dict[str, deque[dict[str, Any]]] = {}

    def add(self, agent: str, summary: Mapping[str, Any]) -> None:
        ring = self._calls.get(agent)
        if ring is None:
            if len(self._calls) >= self._max_agents:
                self._calls.pop(next(iter(self._calls)))
            ring = self._calls[agent] = deque(maxlen=self._per_agent)
        ring.append(dict(summary))

    async def __call__(self, agent: str, limit: int) -> list[dict[str, Any]]:
        ring = self._calls.get(agent, ())
        return list(reversed(ring))[: max(limit, 0)]


# ------------------------------------------------------------------------------------ the bundle


class ApprovalDesk(Protocol):
    """What the control plane asks of the approval engine (``gateway.pipeline.approvals.engine``)."""

    @property
    def store(self) -> ApprovalStore: ...

    @property
    def grant_service(self) -> Any: ...

    async def resolve(
        self, id_or_prefix: str, decision: Any, resolved_by: str, channel: Any, reason: str = ""
    ) -> Approval: ...

    def shown_arguments(self, approval_id: str) -> ShownArguments | None: ...


@dataclass(frozen=True)
class ControlServices:
    """Everything the control plane reads and changes (see the module docstring)."""

    policy_store: PolicyStore
    catalogue: CatalogueProvider
    approvals: ApprovalDesk
    trace_append: TraceAppend
    read_json: JsonReader
    pins: PinService | None = None
    prompt_pins: PinService | None = None
    """Held-back prompts and accepting them (``pin_prompts``), on the same routes as tools."""
    recent_calls: RecentCalls | None = None
    clock: Clock = field(default=utc_clock)
    checkpoint: Callable[[], Awaitable[str | None]] | None = None
    """A signed checkpoint of the trace as it stands now (None: the gateway signs none)."""
    upstreams: Callable[[], Mapping[str, str | None]] | None = None
    """Each upstream by name: None while it serves, else why not (what ``/readyz`` reads); None when
    the gateway has no other upstream than the one it runs with (wrap: it ends when its child does)."""
    shadow: Callable[[], Mapping[str, Any] | None] | None = None
    """What the shadow policy would have decided, tallied (``GET /shadow``); None: no shadow policy."""


__all__ = [
    "PIN_ACCEPT_KIND",
    "ApprovalDesk",
    "CatalogueItem",
    "CatalogueProvider",
    "ControlServices",
    "HeldBackTool",
    "JsonReader",
    "PinService",
    "RecentCallRing",
    "RecentCalls",
    "StorePinService",
    "TraceAppend",
    "agent_visible_name",
    "current_catalogue",
    "utc_clock",
]
