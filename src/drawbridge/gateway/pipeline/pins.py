"""Pinned catalogues at run time: each upstream's tools checked against their accepted pins, and the
floors that follow from the check.

Invariant: a floor below deny comes only from a check that completed for the catalogue the upstream
lists now. ``pinned`` has no floor, ``changed`` has the floor ``human_approval``, ``new`` the floor
``deny``. Every other situation holds every tool of the server back with the floor ``deny``: its pins
cannot be read or written (``PinStoreUnavailable``, or any other failure of the check), or the
upstream's catalogue changed and has not been checked yet. The floor is combined with the policy's
decision as ``stricter(floor, decision)`` (``catalogue.floors.apply_floor``), so no policy relaxes it.

Theory of operation. ``CataloguePins`` knows the upstreams it guards (``CatalogueSource``: a name,
the raw tools it lists now, and ``catalogue_version``, which the upstream session increments before
it reports every catalogue load: connect, reconnect, ``notifications/tools/list_changed``). The hub
awaits ``check(server)`` on each such report, before agents see the new list. A check:

1. fingerprints each listed tool (``catalogue.fingerprint.tool_fingerprint``: name, title,
   description, schemas, annotations; so a rename is a removal plus a new tool). A tool that cannot
   be fingerprinted or pinned (listed twice, a name too long, a field that is not JSON) gets no
   status and stays ``new``: it is held back, its refusal says why (``why_unpinnable``), and it is
   never taken for removed (``unpinnable``);
2. pins the catalogue whole if the server was never pinned (trust on first use, recorded as
   ``mesh.pin_first_use``), else loads the pins;
3. compares (``catalogue.fingerprint.compare``) and records the observation in the pin store, so that
   ``POST /tools/pins/accept`` (any process) pins exactly what the server offers now (and, given the
   fingerprints a person reviewed, only if that is what they reviewed);
4. publishes the statuses for that catalogue version and, when tools are held back or pinned tools
   are gone, records ``mesh.pin_held_back`` with both descriptions.

What agents read follows the pins too (``listed``: serve's ``tools/list`` of its merged catalogue;
``shown``: each page of the server's own ``tools/list`` answer that wrap relays): a ``changed`` tool
is listed as its pinned definition, a ``new`` one not at all, so a definition nobody accepted never
reaches a model; its calls are still decided by the floors above.

The same class guards prompts (``kind=PROMPTS``, ``pin_prompts``): its sources list prompts (as
``tools``), its store is the prompt pin store, its records carry ``"kind": "prompt"`` and the prompt's
name under ``prompt`` (a tool's records are as they always were), and no floor is read from it: the
prompts' callers (``serve.prompt_pins``, ``transports.wrap_prompts``) list and refuse by its statuses.

A failure anywhere publishes "unavailable" for that version (recorded as
``mesh.pin_store_unavailable``; the reason agents read names no database, the cause with the database
goes to the log and the record's ``failure``), and is checked again after a backoff until a check
reads the pins (``retry_unavailable``): a database back from an outage lifts the hold by itself. Checks
of one server are serialized; a call that arrives while its
server's catalogue is being checked waits for the check (at most ``wait_seconds``) and is then held
back if it is still unchecked. The floor stage applies the floor to the policy's verdict for
``tools/call`` (``floors.Floors``); acceptance (``after_accept``) re-runs the check so the new pins are
in force at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import anyio
from anyio.abc import TaskStatus

from drawbridge.canonical import sanitize
from drawbridge.catalogue.fingerprint import TOOLS, PinnedKind, PinStatus, compare
from drawbridge.catalogue.floors import Floor, tool_floor
from drawbridge.catalogue.names import namespaced
from drawbridge.policy.model import Action
from drawbridge.gateway.pipeline.pinnable import as_declared, pinnable, stored_document
from drawbridge.state.backend import StateBackend
from drawbridge.state.pins import PinStore, PinStoreUnavailable, SqlitePinStore, ToolDefinition

logger = logging.getLogger("drawbridge.gateway.pins")

PIN_FIRST_USE_KIND: Final = "mesh.pin_first_use"
PIN_HELD_BACK_KIND: Final = "mesh.pin_held_back"
PIN_STORE_UNAVAILABLE_KIND: Final = "mesh.pin_store_unavailable"
DEFAULT_WAIT_SECONDS: Final = 5.0
RETRY_FIRST_SECONDS: Final = 0.5
RETRY_MAX_SECONDS: Final = 5.0
"""A check that could not read the pins is tried again after these, doubling (``retry_unavailable``)."""

TraceAppend = Callable[[str, Mapping[str, Any]], Awaitable[Any]]


class CatalogueSource(Protocol):
    """What the pins read of an upstream (``UpstreamSession`` has all of it)."""

    @property
    def name(self) -> str: ...

    @property
    def tools(self) -> Sequence[Any]: ...

    @property
    def catalogue_version(self) -> int: ...


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ServerPins:
    """The result of one check of one server's catalogue."""

    version: int
    """The upstream's ``catalogue_version`` this check covers."""
    statuses: Mapping[str, PinStatus] = field(default_factory=dict)
    """Upstream tool name -> status; a listed tool missing here is held back as ``new``."""
    unavailable: str | None = None
    """Why every tool of the server is held back (the pins could not be read or written)."""
    accepted: Mapping[str, tuple[str, Mapping[str, Any] | None]] = field(default_factory=dict)
    """Upstream tool name -> its pin as this check read it: the fingerprint, and the pinned document
    (``pinned_document``; None when the pin predates the store keeping it), for ``listed``."""
    unpinnable: Mapping[str, str] = field(default_factory=dict)
    """Upstream name -> why it cannot be pinned as listed (``pinnable``): held back as ``new``, but
    refused saying why, since no accept can lift it."""

    def why_unpinnable(self, name: str) -> str | None:
        """Why the listed ``name`` cannot be pinned ("held back: ..." for a refusal), None when it can."""
        reason = None if self.unavailable is not None else self.unpinnable.get(name)
        return None if reason is None else f"it cannot be accepted as the server offers it: {reason}"

    def status(self, name: str) -> PinStatus:
        if self.unavailable is not None:
            return PinStatus.NEW
        return self.statuses.get(name, PinStatus.NEW)


class CataloguePins:
    """Pin statuses of every guarded upstream, kept current by ``check`` (module docstring)."""

    def __init__(
        self,
        store: PinStore,
        sources: Iterable[CatalogueSource],
        trace_append: TraceAppend,
        *,
        clock: Callable[[], datetime] = utc_now,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        shown_name: Callable[[str, str], str] = namespaced,
        kind: PinnedKind = TOOLS,
    ) -> None:
        if not math.isfinite(wait_seconds) or wait_seconds < 0:
            raise ValueError("wait_seconds must be a finite number >= 0")
        self._store = store
        self.kind = kind
        """What these pins guard: tools (``pin_tools``, the floors) or prompts (``pin_prompts``); a
        prompt source lists its prompts as ``tools``."""
        self._sources: dict[str, CatalogueSource] = {}
        for source in sources:
            if source.name in self._sources:
                raise ValueError(f"duplicate upstream name {source.name!r}")
            self._sources[source.name] = source
        self._trace = trace_append
        self._clock = clock
        self._shown = shown_name
        """``(server, tool) -> the name agents call it by``, for the records (``server.tool`` under serve)."""
        self._wait = wait_seconds
        self._servers: dict[str, ServerPins] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._published: dict[str, anyio.Event] = {}
        self._checked_once: set[str] = set()
        self._generation_seen: dict[str, int] = {}
        self._failed = anyio.Event()
        """Set when a check publishes "unavailable": ``retry_unavailable`` starts retrying."""
        self.revision = 0
        """Counts published checks; a view computed from the floors is current while it is unchanged."""

    @property
    def store(self) -> PinStore:
        """The pin store these pins check against (the control plane shows and accepts from it)."""
        return self._store

    def add_source(self, source: CatalogueSource) -> None:
        """Guard one more upstream (wrap adds its server once the relay that lists it exists)."""
        if source.name in self._sources:
            raise ValueError(f"duplicate upstream name {source.name!r}")
        self._sources[source.name] = source

    # ------------------------------------------------------------------------------------ reading

    def servers(self) -> list[str]:
        return list(self._sources)

    def state(self, server: str) -> ServerPins | None:
        return self._servers.get(server)

    def _current(self, server: str) -> ServerPins | None:
        """The published check if it covers the catalogue the upstream lists now, else None."""
        source = self._sources.get(server)
        state = self._servers.get(server)
        if source is None or state is None or state.version != source.catalogue_version:
            return None
        return state

    def status(self, server: str, name: str) -> PinStatus:
        """The status of a listed tool; ``new`` (held back) when unchecked or unavailable."""
        state = self._current(server)
        return PinStatus.NEW if state is None else state.status(name)

    def held(self, server: str) -> str | None:
        """Why every tool of ``server`` is held back now (its catalogue not checked yet, its pins
        unavailable), or None when a check of its current catalogue decides tool by tool."""
        if server not in self._sources:
            return f"no guarded upstream is named {sanitize(server)!r}"
        state = self._current(server)
        if state is None:
            return (
                f"the {self.kind.name} catalogue of server {sanitize(server)!r} has not been checked against "
                f"its pins yet; every {self.kind.name} of this server is held back"
            )
        return state.unavailable

    def offered(self, server: str) -> dict[str, ToolDefinition] | None:
        """What ``server`` offers this gateway now (its last listing), None before it listed any: the
        control plane shows and accepts this gateway's own server's definitions."""
        source = self._sources.get(server)
        if source is None or source.catalogue_version == 0:
            return None
        return dict(pinnable(source.tools, self.kind).definitions)

    def unavailable(self) -> list[str]:
        """The guarded servers whose current catalogue's check could not read their pins (``/readyz``)."""
        return sorted(s for s in self._sources if (state := self._current(s)) is not None and state.unavailable)

    def floor(self, server: str, name: str) -> Floor:
        """The floor of a call to ``name`` of ``server`` now, without waiting for a check."""
        held = self.held(server)
        if held is not None:
            return Floor(Action.DENY, (held,))
        state = self._current(server)
        assert state is not None
        return tool_floor(state.status(name), pin_reason=state.why_unpinnable(name))

    def why_unpinnable(self, server: str, name: str) -> str | None:
        """Why ``name``, listed by ``server`` now, cannot be pinned (listed twice, no fingerprint), or None."""
        state = self._current(server)
        return None if state is None else state.why_unpinnable(name)

    def unpinnable(self, server: str) -> dict[str, str]:
        """What ``server`` offers now that cannot be pinned, and why (the control plane lists these,
        and an accept never takes them for removed)."""
        source = self._sources.get(server)
        if source is None or source.catalogue_version == 0:
            return {}
        return dict(pinnable(source.tools, self.kind).unpinnable)

    def checking(self, server: str) -> bool:
        """Whether a call to ``server`` would wait for a check of its catalogue (``floor_when_checked``)."""
        return server in self._sources and self._wait > 0 and self._current(server) is None

    async def floor_when_checked(self, server: str, name: str) -> Floor:
        """Like ``floor``, but first waits (bounded) for a check of the current catalogue in progress."""
        await self.wait_checked(server)
        return self.floor(server, name)

    async def wait_checked(self, server: str) -> None:
        """Wait (at most ``wait_seconds``) until the catalogue ``server`` lists now has been checked."""
        if server in self._sources and self._current(server) is None and self._wait > 0:
            with anyio.move_on_after(self._wait):
                while self._current(server) is None:
                    await self._event(server).wait()

    def _event(self, server: str) -> anyio.Event:
        event = self._published.get(server)
        if event is None:
            event = self._published[server] = anyio.Event()
        return event

    # ------------------------------------------------------------------------------------ checking

    async def check(self, server: str, cause: str | None = None) -> bool:
        """Check the server's current catalogue against its pins and publish the result.

        Never raises (except cancellation): a failure is published as "every tool held back".
        Returns True when the published statuses differ from the previous ones.
        """
        source = self._sources.get(server)
        if source is None:
            raise ValueError(f"no guarded upstream is named {server!r}")
        lock = self._locks.get(server)
        if lock is None:
            lock = self._locks[server] = anyio.Lock()
        async with lock:
            version = source.catalogue_version
            tools = tuple(source.tools)
            generation = getattr(source, "generation", None)
            if cause is None:
                if server not in self._checked_once:
                    cause = "connect"
                elif generation is not None and generation != self._generation_seen.get(server):
                    cause = "reconnect"
                else:
                    cause = "list_changed"
            if isinstance(generation, int):
                self._generation_seen[server] = generation
            self._checked_once.add(server)
            try:
                state, events = await self._compare(server, version, tools, cause)
            except Exception as exc:  # noqa: BLE001 -- whatever failed, the server is held back
                reason = _unavailable_reason(server, exc, self.kind.name)
                body = {"server": server, "cause": cause, "reason": reason}
                if self.kind is not TOOLS:
                    body["kind"] = self.kind.name
                if isinstance(exc, PinStoreUnavailable) and exc.cause != exc.detail:
                    body["failure"] = exc.cause  # names the database: for the operator, never the agent
                logger.error("%s%s", reason, f" ({body['failure']})" if "failure" in body else "")
                state = ServerPins(version, {}, reason)
                events = [(PIN_STORE_UNAVAILABLE_KIND, body)]
            previous = self._servers.get(server)
            changed = previous is None or (previous.statuses, previous.unavailable) != (
                state.statuses,
                state.unavailable,
            )
            self._servers[server] = state
            self.revision += 1
            event = self._published.pop(server, None)
            if event is not None:
                event.set()
            if state.unavailable is not None:
                self._failed.set()
            for kind, body in events:
                await self._record(kind, body)
            return changed

    async def _compare(
        self, server: str, version: int, tools: tuple[Any, ...], cause: str
    ) -> tuple[ServerPins, list[tuple[str, dict[str, Any]]]]:
        kind = self.kind
        listed = pinnable(tools, kind)
        marked = {} if kind is TOOLS else {"kind": kind.name}  # a tool's records are as they always were
        now = self._clock()
        events: list[tuple[str, dict[str, Any]]] = []
        first = False
        if not await self._store.is_pinned(server):
            first = await self._store.trust_on_first_use(server, listed.definitions, at=now)
        pins = await self._store.load(server)
        comparison = compare({name: pin.fingerprint for name, pin in pins.items()}, listed.tools, kind)
        await self._store.observe(server, listed.definitions, at=now)
        if first:
            events.append(
                (
                    PIN_FIRST_USE_KIND,
                    {
                        "server": server,
                        **marked,
                        "cause": cause,
                        "count": len(listed.definitions),
                        f"{kind.name}s": [
                            {kind.name: name, "fingerprint": d.fingerprint}
                            for name, d in sorted(listed.definitions.items())
                        ],
                    },
                )
            )
        held = [tool for tool in comparison.tools if tool.status is not PinStatus.PINNED]
        if held or comparison.removed or listed.skipped:
            rows = []
            for tool in held:
                pin = pins.get(tool.name)
                row = {
                    "name": self._shown(server, tool.name),
                    kind.name: tool.name,
                    "status": tool.status.value,
                    "pinned_fingerprint": None if pin is None else pin.fingerprint,
                    "pinned_description": None if pin is None else pin.description,
                    "fingerprint": tool.fingerprint,
                    "description": listed.definitions[tool.name].description,
                }
                if kind is TOOLS:  # a prompt has no floor: prompts/get of a held-back one is refused
                    row["floor"] = tool_floor(tool.status).action.value
                rows.append(row)
            events.append(
                (
                    PIN_HELD_BACK_KIND,
                    {
                        "server": server,
                        **marked,
                        "cause": cause,
                        f"{kind.name}s": rows,
                        "unpinnable": list(listed.skipped),
                        "removed": list(comparison.removed),
                    },
                )
            )
        accepted = {name: (pin.fingerprint, stored_document(pin.definition)) for name, pin in pins.items()}
        return ServerPins(version, dict(comparison.statuses), accepted=accepted, unpinnable=listed.unpinnable), events

    def listed(self, server: str, name: str, item: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """What agents are shown of a tool in ``tools/list``: only what a person accepted.

        A tool whose definition is its pin's is listed as it is; a ``changed`` one as its pinned
        definition (the fields the fingerprint covers taken from the pin, the rest as listed now),
        or not at all when the pin predates the store keeping definitions; a ``new`` one is not
        listed, and no tool of a server whose pins are unavailable or never checked is. Calls are
        decided as before (the floors), so this changes what the model reads, not what it may do.
        The fingerprint is taken here, not the status, so an item listed while a newer check was
        published is still shown only if it is the accepted one.
        """
        if server not in self._sources:
            return item
        state = self._servers.get(server)
        if state is None or state.unavailable is not None:
            return None
        pin = state.accepted.get(name)
        if pin is None:
            return None
        fingerprint, document = pin
        try:
            if self.kind.fingerprint(item) == fingerprint:
                return item
        except ValueError:
            return None
        if document is None:
            return None
        fields = self.kind.fields
        shown = {key: value for key, value in item.items() if key not in fields or key == "name"}
        shown.update((key, as_declared(key, value)) for key, value in document.items() if key != "name" and value is not None)
        return shown

    def shown(self, server: str, tools: Sequence[Any]) -> list[Any] | None:
        """One page of ``server``'s ``tools/list`` answer as agents are shown it (``listed`` for each
        tool; an item without a name is not listed either). None when every tool is shown as listed,
        so that an answer holding only accepted definitions can pass as the server wrote it."""
        shown: list[Any] = []
        rewritten = False
        for item in tools:
            name = item.get("name") if isinstance(item, Mapping) else None
            listed = self.listed(server, name, item) if isinstance(name, str) else None
            if listed is not None:
                shown.append(listed)
            rewritten = rewritten or listed is not item
        return shown if rewritten else None

    async def _record(self, kind: str, body: Mapping[str, Any]) -> None:
        try:
            await self._trace(kind, body)
        except Exception as exc:  # noqa: BLE001 -- the trace appender marks the gateway as failed
            logger.error("recording %s failed (%s)", kind, type(exc).__name__)

    async def retry_unavailable(
        self,
        on_change: Sequence[Callable[[str], Awaitable[Any]]] = (),
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Forever: check again every server whose pins could not be read, after a backoff that doubles
        up to ``RETRY_MAX_SECONDS``, until each check reads them; then ``on_change(server)`` when its
        floors changed. Without it a check that failed while the database was away (a restart) would
        hold every tool back until the upstream's catalogue changed again."""
        task_status.started()
        while True:
            await self._failed.wait()
            self._failed = anyio.Event()  # a failure from now on starts another round
            backoff = RETRY_FIRST_SECONDS
            while self.unavailable():
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_SECONDS)
                for server in self.unavailable():
                    if await self.check(server, "retry") and self._current(server) is not None:
                        for callback in on_change:
                            await callback(server)

    async def after_accept(self, server: str) -> None:
        """Pins of ``server`` changed (``POST /tools/pins/accept``): put the new floors in force now."""
        if server in self._sources:
            await self.check(server, "accept")


def open_pins(
    db: StateBackend | None, trace_append: TraceAppend, kind: PinnedKind
) -> tuple[SqlitePinStore, CataloguePins]:
    """The pin store of ``kind`` on the state database and the ``CataloguePins`` that check against
    it (no upstream yet: each is added as its catalogue becomes known)."""
    assert db is not None, "pinning needs the state database"
    store = SqlitePinStore(db, kind.name)
    return store, CataloguePins(store, (), trace_append, kind=kind)


def _unavailable_reason(server: str, exc: BaseException, kind: str) -> str:
    if isinstance(exc, PinStoreUnavailable):
        return str(exc)
    return (
        f"pin store unavailable for server {sanitize(server)!r}: the check failed ({type(exc).__name__}); "
        f"every {kind} of this server is held back until the pin store can be read"
    )


__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "RETRY_MAX_SECONDS",
    "PIN_FIRST_USE_KIND",
    "PIN_HELD_BACK_KIND",
    "PIN_STORE_UNAVAILABLE_KIND",
    "CataloguePins",
    "CatalogueSource",
    "ServerPins",
    "open_pins",
    "pinnable",
]
