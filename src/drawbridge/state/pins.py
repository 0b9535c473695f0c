"""Pinned tool catalogues: per upstream server, the fingerprint, description and definition of each
accepted tool.

Invariant: a pin store that cannot be read holds every tool of that server
back. Any failure while reading a server's pins (the database cannot be
opened or read, a page is corrupt, the table is missing, a row does not have
the form written here) raises ``PinStoreUnavailable`` naming the server and
the problem. It never returns an empty or partial pin set, which the catalogue
would read as "everything is new" or, worse, "nothing changed".

Theory of operation. The catalogue layer computes each tool's fingerprint
(``sha256:`` digest over its definition) and decides pin statuses; this store
only keeps three things per server:

* the pins: tool name -> ``PinnedTool(fingerprint, description, pinned_at,
  pinned_by, definition)``, read with ``load(server)``;
* whether the server's catalogue was ever pinned (``is_pinned``), so that a
  server with no tools is not mistaken for a server never seen;
  ``trust_on_first_use`` pins a never-seen server whole, atomically;
* the catalogue last observed from the server (``observe`` / ``observed``),
  so that ``accept(server, names | None)`` can pin what the server offers
  now, from any process (the CLI or the control plane), without asking the
  gateway that saw it.

``replace(server, tools)`` sets a server's pins wholesale. ``accept`` pins the
observed definition of each named tool (or of every tool that differs from
its pin, when ``names`` is None) and drops the pin of a named tool the server
no longer offers; given ``reviewed`` (the fingerprints a person was shown) it
pins only those definitions, checked in the same transaction, and otherwise
raises ``PinConflict`` having changed nothing; it returns one ``PinAcceptance`` per change, whose
``record()`` is the trace-chain body (``mesh.pin_accept``: both descriptions and
the new fingerprint). Descriptions are stored because a person deciding
whether to accept a change needs to read what changed; so is the whole definition (``definition``:
the JCS text the fingerprint is the SHA-256 of, schema version 5 on), so that the pinned input and
output schemas and annotations can be set beside the current ones. A definition is kept only when it
hashes to its row's fingerprint (checked on write and on read); rows written before version 5 have
none (None), and the change then shows by its description alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

from drawbridge.canonical import is_sha256_digest, sanitize, sha256_prefixed
from drawbridge.state.backend import StateBackend
from drawbridge.state.pin_types import (
    FIRST_USE_BY,
    KINDS,
    MAX_NAME,
    PROMPT,
    TOOL,
    InvalidPin,
    ObservedTool,
    PinAcceptance,
    PinConflict,
    PinError,
    PinnedTool,
    PinStoreUnavailable,
    ToolDefinition,
    UnknownTool,
)
from drawbridge.state.sqlite import StateUnavailable, from_db_time, to_db_time

T = TypeVar("T")


class PinStore(Protocol):
    async def load(self, server: str) -> dict[str, PinnedTool]: ...

    async def is_pinned(self, server: str) -> bool: ...

    async def trust_on_first_use(
        self, server: str, tools: Mapping[str, ToolDefinition], *, at: datetime
    ) -> bool: ...

    async def replace(
        self, server: str, tools: Mapping[str, ToolDefinition], *, pinned_by: str, at: datetime
    ) -> dict[str, PinnedTool]: ...

    async def observe(self, server: str, tools: Mapping[str, ToolDefinition], *, at: datetime) -> None: ...

    async def observed(self, server: str) -> dict[str, ObservedTool]: ...

    async def accept(
        self,
        server: str,
        names: Iterable[str] | None = None,
        *,
        accepted_by: str,
        at: datetime,
        reviewed: Mapping[str, str | None] | None = None,
        offered: Mapping[str, ToolDefinition] | None = None,
        dry_run: bool = False,
        unpinnable: Mapping[str, str] | None = None,
    ) -> list[PinAcceptance]: ...


# -- validation --------------------------------------------------------------------------------


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPin(f"{what} must be non-empty text")
    if len(value) > MAX_NAME:
        raise InvalidPin(f"{what} is longer than {MAX_NAME} characters")
    return value


def _check_tools(tools: Mapping[str, ToolDefinition]) -> dict[str, ToolDefinition]:
    if not isinstance(tools, Mapping):
        raise InvalidPin("tools must be a mapping of tool name to ToolDefinition")
    checked: dict[str, ToolDefinition] = {}
    for name, definition in tools.items():
        _check_name(name, "tool name")
        shown = repr(sanitize(name))
        if not isinstance(definition, ToolDefinition):
            raise InvalidPin(f"tool {shown}: expected a ToolDefinition, not {type(definition).__name__}")
        if not is_sha256_digest(definition.fingerprint):
            raise InvalidPin(f"tool {shown}: fingerprint must be sha256:<64 lowercase hex>")
        if definition.description is not None and not isinstance(definition.description, str):
            raise InvalidPin(f"tool {shown}: description must be text or None")
        if not _definition_fits(definition.definition, definition.fingerprint):
            raise InvalidPin(f"tool {shown}: definition must be the text its fingerprint is the digest of")
        checked[name] = definition
    return checked


def _definition_fits(definition: object, fingerprint: str) -> bool:
    """Whether ``definition`` is absent, or the text whose SHA-256 ``fingerprint`` is."""
    if definition is None:
        return True
    return isinstance(definition, str) and sha256_prefixed(definition.encode("utf-8")) == fingerprint


def _decode_pin(server: str, row: tuple[Any, ...], kind: str) -> tuple[str, PinnedTool]:
    """One pins row of ``kind``, checked field by field; a malformed row makes the whole server
    unreadable (for that kind), and the problem names the kind of the row."""
    name, fingerprint, description, pinned_at, pinned_by, definition = row
    if not isinstance(name, str) or not name:
        raise PinStoreUnavailable(server, f"a pin row has a malformed {kind} name", kind=kind)
    where = f"the pin of {kind} {sanitize(name)[:200]!r}"
    if not is_sha256_digest(fingerprint):
        raise PinStoreUnavailable(server, f"{where} has a malformed fingerprint (expected sha256:<64 hex>)", kind=kind)
    if description is not None and not isinstance(description, str):
        raise PinStoreUnavailable(server, f"{where} has a description that is not text", kind=kind)
    if not isinstance(pinned_by, str):
        raise PinStoreUnavailable(server, f"{where} has a pinned_by that is not text", kind=kind)
    if not _definition_fits(definition, fingerprint):
        raise PinStoreUnavailable(server, f"{where} has a definition its fingerprint is not the digest of", kind=kind)
    try:
        when = from_db_time(pinned_at)
    except ValueError:
        raise PinStoreUnavailable(server, f"{where} has a malformed pinned_at timestamp", kind=kind) from None
    return name, PinnedTool(fingerprint, description, when, pinned_by, definition)


def _read_pins(conn: sqlite3.Connection, server: str, kind: str) -> dict[str, PinnedTool]:
    rows = conn.execute(
        "SELECT name, fingerprint, description, pinned_at, pinned_by, definition FROM pins "
        "WHERE server = ? AND kind = ? ORDER BY name",
        (server, kind),
    ).fetchall()
    return dict(_decode_pin(server, row, kind) for row in rows)


def _read_observed(conn: sqlite3.Connection, server: str, kind: str) -> dict[str, ObservedTool]:
    out: dict[str, ObservedTool] = {}
    for name, fingerprint, description, observed_at, definition in conn.execute(
        "SELECT name, fingerprint, description, observed_at, definition FROM observed_tools "
        "WHERE server = ? AND kind = ? ORDER BY name",
        (server, kind),
    ):
        row = f"an observed {kind} row"
        if not isinstance(name, str) or not is_sha256_digest(fingerprint):
            raise PinStoreUnavailable(server, f"{row} is malformed", kind=kind)
        if description is not None and not isinstance(description, str):
            raise PinStoreUnavailable(server, f"{row} has a description that is not text", kind=kind)
        if not _definition_fits(definition, fingerprint):
            raise PinStoreUnavailable(server, f"{row} has a definition its fingerprint does not cover", kind=kind)
        try:
            out[name] = ObservedTool(fingerprint, description, from_db_time(observed_at), definition)
        except ValueError:
            raise PinStoreUnavailable(server, f"{row} has a malformed timestamp", kind=kind) from None
    return out


def _write_pins(
    conn: sqlite3.Connection, server: str, kind: str, tools: Mapping[str, ToolDefinition], by: str, when: str
) -> None:
    conn.execute("DELETE FROM pins WHERE server = ? AND kind = ?", (server, kind))
    conn.execute(
        "INSERT INTO pin_servers (server, kind, pinned_at, pinned_by) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (server, kind) DO UPDATE SET pinned_at = excluded.pinned_at, pinned_by = excluded.pinned_by",
        (server, kind, when, by),
    )
    conn.executemany(
        "INSERT INTO pins (server, kind, name, fingerprint, description, pinned_at, pinned_by, definition) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(server, kind, name, d.fingerprint, d.description, when, by, d.definition) for name, d in tools.items()],
    )


def _check_reviewed(reviewed: Mapping[str, str | None]) -> dict[str, str | None]:
    if not isinstance(reviewed, Mapping):
        raise InvalidPin("reviewed must be a mapping of tool name to fingerprint")
    for name, fingerprint in reviewed.items():
        _check_name(name, "tool name")
        if fingerprint is not None and not is_sha256_digest(fingerprint):
            raise InvalidPin(f"tool {sanitize(name)!r}: a reviewed fingerprint must be sha256:<64 lowercase hex>")
    return dict(reviewed)


def _check_bound(
    server: str,
    reviewed: Mapping[str, str | None],
    candidates: Iterable[str],
    pinned: Mapping[str, PinnedTool],
    observed: Mapping[str, ObservedTool],
) -> None:
    """Refuse an acceptance whose reviewed fingerprints are not what would be pinned now."""
    problems: list[str] = []
    for name, fingerprint in sorted(reviewed.items()):
        seen = observed.get(name)
        now = None if seen is None else seen.fingerprint
        if now != fingerprint:
            problems.append(
                f"{sanitize(name)[:200]!r} was reviewed as {fingerprint or 'removed'} "
                f"but is {now or 'removed'} now"
            )
    for name in candidates:  # dropping the pin of a tool gone pins nothing, so it needs no review
        pin, seen = pinned.get(name), observed.get(name)
        if seen is not None and (pin is None or pin.fingerprint != seen.fingerprint) and name not in reviewed:
            problems.append(f"{sanitize(name)[:200]!r} would change but no reviewed fingerprint names it")
    if problems:
        raise PinConflict(
            f"server {sanitize(server)!r} does not offer what was reviewed; nothing was accepted: "
            + "; ".join(problems[:5])
            + ("" if len(problems) <= 5 else f"; and {len(problems) - 5} more")
        )


def _write_observed(
    conn: sqlite3.Connection, server: str, kind: str, tools: Mapping[str, ToolDefinition], when: str
) -> None:
    conn.execute("DELETE FROM observed_tools WHERE server = ? AND kind = ?", (server, kind))
    conn.execute(
        "INSERT INTO observed_servers (server, kind, observed_at) VALUES (?, ?, ?) "
        "ON CONFLICT (server, kind) DO UPDATE SET observed_at = excluded.observed_at",
        (server, kind, when),
    )
    conn.executemany(
        "INSERT INTO observed_tools (server, kind, name, fingerprint, description, observed_at, definition) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(server, kind, name, d.fingerprint, d.description, when, d.definition) for name, d in tools.items()],
    )


class SqlitePinStore:
    """``PinStore`` on the embedded SQLite database. See the module docstring."""

    def __init__(self, db: StateBackend, kind: str = TOOL) -> None:
        if kind not in KINDS:
            raise ValueError(f"a pin kind is one of {', '.join(KINDS)}")
        self._db = db
        self.kind = kind
        """What this store pins (``tool`` or ``prompt``): every row it reads or writes has this kind."""

    def _unavailable(self, server: str, exc: StateUnavailable) -> PinStoreUnavailable:
        """``exc`` said of this store's kind (a malformed row is found before the kind is known)."""
        cause = exc.cause if isinstance(exc, PinStoreUnavailable) else str(exc)
        return PinStoreUnavailable(server, exc.detail, cause=cause, kind=self.kind)

    async def _read(self, server: str, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        try:
            return await self._db.read(fn, what)
        except StateUnavailable as exc:
            raise self._unavailable(server, exc) from None

    async def _write(self, server: str, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        try:
            return await self._db.write(fn, what)
        except StateUnavailable as exc:
            raise self._unavailable(server, exc) from None

    async def load(self, server: str) -> dict[str, PinnedTool]:
        """The pins of ``server`` ({} when it has none); ``PinStoreUnavailable`` when they cannot be read."""
        _check_name(server, "server")
        return await self._read(server, lambda conn: _read_pins(conn, server, self.kind), "read pins")

    async def is_pinned(self, server: str) -> bool:
        """Whether the catalogue of ``server`` was ever pinned (even with no tools)."""
        _check_name(server, "server")
        sql = "SELECT 1 FROM pin_servers WHERE server = ? AND kind = ?"
        return await self._read(
            server, lambda conn: conn.execute(sql, (server, self.kind)).fetchone() is not None, "read pinned servers"
        )

    async def trust_on_first_use(
        self, server: str, tools: Mapping[str, ToolDefinition], *, at: datetime
    ) -> bool:
        """Pin ``tools`` whole if ``server`` was never pinned; True when it did. Atomic."""
        _check_name(server, "server")
        checked = _check_tools(tools)
        when = to_db_time(at)

        def first_use(conn: sqlite3.Connection) -> bool:
            if conn.execute(
                "SELECT 1 FROM pin_servers WHERE server = ? AND kind = ?", (server, self.kind)
            ).fetchone():
                return False
            _write_pins(conn, server, self.kind, checked, FIRST_USE_BY, when)
            return True

        return await self._write(server, first_use, "pin on first use")

    async def replace(
        self, server: str, tools: Mapping[str, ToolDefinition], *, pinned_by: str, at: datetime
    ) -> dict[str, PinnedTool]:
        """Set the pins of ``server`` to exactly ``tools``."""
        _check_name(server, "server")
        _check_name(pinned_by, "pinned_by")
        checked = _check_tools(tools)
        when = to_db_time(at)

        def write(conn: sqlite3.Connection) -> dict[str, PinnedTool]:
            _write_pins(conn, server, self.kind, checked, pinned_by, when)
            return _read_pins(conn, server, self.kind)

        return await self._write(server, write, "replace pins")

    async def observe(self, server: str, tools: Mapping[str, ToolDefinition], *, at: datetime) -> None:
        """Record the catalogue the server offers now (replacing the previous observation)."""
        _check_name(server, "server")
        checked = _check_tools(tools)
        when = to_db_time(at)

        await self._write(
            server, lambda conn: _write_observed(conn, server, self.kind, checked, when), "record observed catalogue"
        )

    async def observed(self, server: str) -> dict[str, ObservedTool]:
        _check_name(server, "server")
        return await self._read(
            server, lambda conn: _read_observed(conn, server, self.kind), "read observed catalogue"
        )

    async def accept(
        self,
        server: str,
        names: Iterable[str] | None = None,
        *,
        accepted_by: str,
        at: datetime,
        reviewed: Mapping[str, str | None] | None = None,
        offered: Mapping[str, ToolDefinition] | None = None,
        dry_run: bool = False,
        unpinnable: Mapping[str, str] | None = None,
    ) -> list[PinAcceptance]:
        """Pin what the server offers now, for ``names`` or for every tool that differs from its pin.

        A named tool the server no longer offers loses its pin. Returns the changes, by name.
        ``reviewed`` (tool name -> the fingerprint a person reviewed, None for "removed") binds the
        acceptance to what was shown: ``PinConflict``, and nothing changes, when a tool it names is
        observed with another fingerprint now, or when a definition it does not name would be pinned.
        ``offered``: what the accepting gateway's own server offers now, recorded as the observation in
        this transaction and pinned from: a replica never pins what only another replica's server offers.
        ``dry_run``: every check is made and the changes returned, but nothing is written (an accept of
        several kinds checks each before accepting any). ``unpinnable``: what the server still offers
        but no pin can hold (listed twice, no fingerprint), and why: never taken for removed (its pin is
        kept), and naming one is refused (``PinConflict``), nothing accepted.
        """
        _check_name(server, "server")
        _check_name(accepted_by, "accepted_by")
        wanted = None if names is None else sorted({_check_name(n, "tool name") for n in names})
        bound = None if reviewed is None else _check_reviewed(reviewed)
        own = None if offered is None else _check_tools(offered)
        when = to_db_time(at)
        kind = self.kind

        def write(conn: sqlite3.Connection) -> list[PinAcceptance]:
            if own is not None and not dry_run:
                _write_observed(conn, server, kind, own, when)
            if own is None and conn.execute(
                "SELECT 1 FROM observed_servers WHERE server = ? AND kind = ?", (server, kind)
            ).fetchone() is None:
                raise PinError(
                    f"no catalogue{'' if kind == TOOL else ' of prompts'} has been observed for server "
                    f"{sanitize(server)!r}; nothing to accept"
                )
            pinned = _read_pins(conn, server, kind)
            observed = _read_observed(conn, server, kind) if own is None else {
                name: ObservedTool(d.fingerprint, d.description, from_db_time(when), d.definition)
                for name, d in own.items()
            }
            still = unpinnable or {}
            if wanted is None:
                candidates = sorted((set(pinned) | set(observed)) - set(still))
            else:
                named = [n for n in wanted if n in still]
                if named:
                    raise PinConflict(
                        f"server {sanitize(server)!r} offers "
                        + "; ".join(f"{kind} {sanitize(n)[:200]!r}, which cannot be accepted as offered: "
                                    f"{still[n]}" for n in named[:5])
                        + "; nothing was accepted"
                    )
                unknown = [n for n in wanted if n not in pinned and n not in observed]
                if unknown:
                    shown = ", ".join(repr(sanitize(n)) for n in unknown[:5])
                    what = "" if kind == TOOL else " as prompts"
                    raise UnknownTool(f"neither pinned nor observed{what} for server {sanitize(server)!r}: {shown}")
                candidates = wanted
            if bound is not None:
                _check_bound(server, bound, candidates, pinned, observed)
            if not dry_run:
                conn.execute(
                    "INSERT INTO pin_servers (server, kind, pinned_at, pinned_by) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (server, kind) DO NOTHING",
                    (server, kind, when, accepted_by),
                )
            changes: list[PinAcceptance] = []
            for name in candidates:
                pin, seen = pinned.get(name), observed.get(name)
                if seen is None:
                    if pin is None:
                        continue
                    if not dry_run:
                        conn.execute(
                            "DELETE FROM pins WHERE server = ? AND kind = ? AND name = ?", (server, kind, name)
                        )
                    changes.append(PinAcceptance(server, name, pin, None, accepted_by, at, kind))
                    continue
                if pin is not None and (pin.fingerprint, pin.description) == (
                    seen.fingerprint,
                    seen.description,
                ):
                    continue
                if not dry_run:
                    conn.execute(
                        "INSERT INTO pins (server, kind, name, fingerprint, description, pinned_at, pinned_by, "
                        "definition) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (server, kind, name) DO UPDATE "
                        "SET fingerprint = excluded.fingerprint, description = excluded.description, "
                        "pinned_at = excluded.pinned_at, pinned_by = excluded.pinned_by, "
                        "definition = excluded.definition",
                        (server, kind, name, seen.fingerprint, seen.description, when, accepted_by, seen.definition),
                    )
                accepted = PinnedTool(
                    seen.fingerprint, seen.description, from_db_time(when), accepted_by, seen.definition
                )
                changes.append(PinAcceptance(server, name, pin, accepted, accepted_by, at, kind))
            return changes

        return await self._write(server, write, "accept pins")


__all__ = [
    "FIRST_USE_BY",
    "KINDS",
    "PROMPT",
    "TOOL",
    "InvalidPin",
    "ObservedTool",
    "PinAcceptance",
    "PinConflict",
    "PinError",
    "PinStore",
    "PinStoreUnavailable",
    "PinnedTool",
    "SqlitePinStore",
    "ToolDefinition",
    "UnknownTool",
]
