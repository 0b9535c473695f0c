"""Temporal grants: an operator lets an agent run some tools without asking, for a while.

Invariant: a grant only ever turns ``human_approval`` into ``allow``
(``lift``). It never lifts ``deny``, whether the deny comes from a rule, the
default, a pin floor or an argument schema, and it does nothing once expired
or revoked. Grants are persisted, so a restart neither loses nor extends them,
and each creation and revocation is a trace-chain record (``created_record``,
``revoked_record``; the caller appends them).

Theory of operation. A grant holds an agent glob and a tools glob with the
same semantics as policy globs (``drawbridge.policy.globs``: mesh7's
``filepath.Match`` rules, ``*`` alone matches everything); both are checked
when the grant is created, so a malformed glob is an error, not a grant that
matches nothing. ``active_for(agent, tool, now)`` returns the first grant, in
creation order, that is neither revoked nor expired at ``now`` and whose globs
match; the gateway then calls ``lift(action, grant)``. A grant is active while
``now < expires_at``. Revocation marks the row (who, when) instead of deleting
it, so ``list()`` is the full history and ``list(active_at=t)`` what was in
force at ``t``. A grant may last at most ``max_duration`` (24 hours unless the
store is built with another bound; mesh7 bounded only its MCP path).
Ids and prefixes work as for approvals (``drawbridge.state.ids``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, TypeVar

from drawbridge.approval.durations import format_duration
from drawbridge.policy.globs import Glob, GlobError, compile_glob
from drawbridge.state.ids import (
    AmbiguousId,
    IdSource,
    UnknownId,
    default_id_source,
    new_id,
    rows_by_prefix,
)
from drawbridge.state.backend import StateBackend
from drawbridge.state.sqlite import StateError, StateUnavailable, from_db_time, to_db_time

DEFAULT_MAX_DURATION: Final = timedelta(hours=24)
MAX_TEXT: Final = 1024
_ID_ATTEMPTS: Final = 8
_HUMAN_APPROVAL: Final = "human_approval"
_ALLOW: Final = "allow"

A = TypeVar("A", bound=str)


class GrantError(StateError):
    """Base of the grant store's own errors."""


class InvalidGrant(GrantError, ValueError):
    """A grant the store refuses to create (malformed glob, bad times, too long)."""


class GrantNotFound(UnknownId):
    """No grant has this id or prefix."""


class AmbiguousGrantId(AmbiguousId):
    """Several grants start with this prefix."""


class GrantAlreadyRevoked(GrantError):
    def __init__(self, grant: Grant) -> None:
        super().__init__(f"grant {grant.id} was already revoked by {grant.revoked_by}")
        self.grant = grant


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    agent_glob: str
    tools_glob: str
    created_at: datetime
    expires_at: datetime
    granted_by: str
    revoked_at: datetime | None = None
    revoked_by: str | None = None

    def active_at(self, now: datetime) -> bool:
        return self.revoked_at is None and now < self.expires_at

    def remaining(self, now: datetime) -> timedelta:
        return max(self.expires_at - now, timedelta(0)) if self.revoked_at is None else timedelta(0)

    def created_record(self) -> dict[str, Any]:
        """Trace-chain body for ``grant_created``."""
        return {
            "grant_id": self.id,
            "agent": self.agent_glob,
            "tools": self.tools_glob,
            "granted_by": self.granted_by,
            "created_at": to_db_time(self.created_at),
            "expires_at": to_db_time(self.expires_at),
            "duration": format_duration(self.expires_at - self.created_at),
        }

    def revoked_record(self) -> dict[str, Any]:
        """Trace-chain body for ``grant_revoked``."""
        if self.revoked_at is None:
            raise ValueError(f"grant {self.id} is not revoked")
        return {
            "grant_id": self.id,
            "agent": self.agent_glob,
            "tools": self.tools_glob,
            "revoked_by": self.revoked_by or "",
            "revoked_at": to_db_time(self.revoked_at),
            "expires_at": to_db_time(self.expires_at),
        }


def lift(action: A, grant: Grant | None) -> A:
    """The action after an active grant: ``human_approval`` becomes ``allow``; anything else is unchanged.

    Works on either action enum (``drawbridge.policy.Action``, the pipeline's ``Action``) and on
    plain strings, returning the caller's type. ``deny`` is never lifted, and neither is a value
    this function does not know.
    """
    if grant is None or action != _HUMAN_APPROVAL:
        return action
    return type(action)(_ALLOW)  # type: ignore[return-value]


class GrantStore(Protocol):
    async def create(
        self, agent_glob: str, tools_glob: str, expires_at: datetime, granted_by: str, *, created_at: datetime
    ) -> Grant: ...

    async def list(self, active_at: datetime | None = None) -> list[Grant]: ...

    async def revoke(self, id_or_prefix: str, *, revoked_by: str, at: datetime) -> Grant: ...

    async def active_for(self, agent: str, tool: str, now: datetime) -> Grant | None: ...


_COLUMNS: Final = "id, agent_glob, tools_glob, created_at, expires_at, granted_by, revoked_at, revoked_by"


def _row_to_grant(row: tuple[Any, ...]) -> Grant:
    try:
        id_, agent_glob, tools_glob, created_at, expires_at, granted_by, revoked_at, revoked_by = row
        if not all(isinstance(v, str) for v in (id_, agent_glob, tools_glob, granted_by)):
            raise TypeError("text column holds another type")
        return Grant(
            id=id_,
            agent_glob=agent_glob,
            tools_glob=tools_glob,
            created_at=from_db_time(created_at),
            expires_at=from_db_time(expires_at),
            granted_by=granted_by,
            revoked_at=from_db_time(revoked_at) if revoked_at is not None else None,
            revoked_by=revoked_by,
        )
    except (ValueError, TypeError) as exc:
        raise StateUnavailable(
            f"grant row {str(row[0])[:16]!r} is malformed ({type(exc).__name__}); refusing to use it"
        ) from None


def _find(conn: sqlite3.Connection, id_or_prefix: str) -> Grant:
    prefix, rows = rows_by_prefix(conn, "grants", _COLUMNS, id_or_prefix, "grant")
    if not rows:
        raise GrantNotFound("grant", f"no grant with id {prefix}")
    if len(rows) > 1:
        raise AmbiguousGrantId(
            "grant", f"grant id prefix {prefix} matches several grants; give more characters"
        )
    return _row_to_grant(rows[0])


def _check_text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidGrant(f"{field} must be non-empty text")
    if len(value) > MAX_TEXT:
        raise InvalidGrant(f"{field} is longer than {MAX_TEXT} characters")
    return value


class SqliteGrantStore:
    """``GrantStore`` on the embedded SQLite database. See the module docstring."""

    def __init__(
        self,
        db: StateBackend,
        *,
        id_source: IdSource = default_id_source,
        max_duration: timedelta = DEFAULT_MAX_DURATION,
    ) -> None:
        if max_duration <= timedelta(0):
            raise ValueError("max_duration must be positive")
        self._db = db
        self._id_source = id_source
        self._max_duration = max_duration
        self._globs: dict[str, Glob] = {}

    def _glob(self, text: str) -> Glob | None:
        glob = self._globs.get(text)
        if glob is None:
            try:
                glob = compile_glob(text)
            except GlobError:
                return None  # a stored glob that no longer compiles can only fail to lift: skip it
            if len(self._globs) < 4096:
                self._globs[text] = glob
        return glob

    async def create(
        self, agent_glob: str, tools_glob: str, expires_at: datetime, granted_by: str, *, created_at: datetime
    ) -> Grant:
        """Persist a new grant; the globs are checked now so a typo cannot become a silent no-op."""
        for field, text in (("agent", agent_glob), ("tools", tools_glob)):
            _check_text(text, f"{field} glob")
            try:
                compile_glob(text)
            except GlobError as exc:
                raise InvalidGrant(f"{field} glob is malformed: {exc}") from None
        _check_text(granted_by, "granted_by")
        created, expires = to_db_time(created_at), to_db_time(expires_at)
        if expires_at <= created_at:
            raise InvalidGrant("a grant must expire after it is created")
        if expires_at - created_at > self._max_duration:
            raise InvalidGrant(
                f"a grant may last at most {format_duration(self._max_duration)}, "
                f"not {format_duration(expires_at - created_at)}"
            )

        def insert(conn: sqlite3.Connection) -> Grant:
            for _ in range(_ID_ATTEMPTS):
                grant_id = new_id(self._id_source, "grant")
                if conn.execute("SELECT 1 FROM grants WHERE id = ?", (grant_id,)).fetchone():
                    continue  # collision: draw again
                conn.execute(
                    "INSERT INTO grants (id, agent_glob, tools_glob, created_at, expires_at, granted_by) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (grant_id, agent_glob, tools_glob, created, expires, granted_by),
                )
                return _find(conn, grant_id)
            raise GrantError(f"could not draw an unused grant id in {_ID_ATTEMPTS} attempts")

        return await self._db.write(insert, "create grant")

    async def list(self, active_at: datetime | None = None) -> list[Grant]:
        """Every grant in creation order, or only those in force at ``active_at``."""
        if active_at is None:
            sql, params = f"SELECT {_COLUMNS} FROM grants ORDER BY seq", ()
        else:
            sql = f"SELECT {_COLUMNS} FROM grants WHERE revoked_at IS NULL AND expires_at > ? ORDER BY seq"
            params = (to_db_time(active_at),)
        return await self._db.read(
            lambda conn: [_row_to_grant(r) for r in conn.execute(sql, params)], "list grants"
        )

    async def revoke(self, id_or_prefix: str, *, revoked_by: str, at: datetime) -> Grant:
        """Mark a grant revoked (by id or unique prefix); revoking twice raises GrantAlreadyRevoked."""
        _check_text(revoked_by, "revoked_by")
        when = to_db_time(at)

        def update(conn: sqlite3.Connection) -> tuple[Grant, bool]:
            grant = _find(conn, id_or_prefix)
            if grant.revoked_at is not None:
                return grant, False
            conn.execute(
                "UPDATE grants SET revoked_at = ?, revoked_by = ? WHERE id = ? AND revoked_at IS NULL",
                (when, revoked_by, grant.id),
            )
            return _find(conn, grant.id), True

        grant, changed = await self._db.write(update, "revoke grant")
        if not changed:
            raise GrantAlreadyRevoked(grant)
        return grant

    async def active_for(self, agent: str, tool: str, now: datetime) -> Grant | None:
        """The first grant in force at ``now`` whose agent and tools globs match, else None."""
        for grant in await self.list(active_at=now):
            agent_glob, tools_glob = self._glob(grant.agent_glob), self._glob(grant.tools_glob)
            if agent_glob is None or tools_glob is None:
                continue
            if agent_glob.matches(agent) and tools_glob.matches(tool):
                return grant
        return None


__all__ = [
    "DEFAULT_MAX_DURATION",
    "AmbiguousGrantId",
    "Grant",
    "GrantAlreadyRevoked",
    "GrantError",
    "GrantNotFound",
    "GrantStore",
    "InvalidGrant",
    "SqliteGrantStore",
    "lift",
]
