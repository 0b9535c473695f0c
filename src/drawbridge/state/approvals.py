"""The approval queue: calls waiting for a person, and how each wait ended.

Invariant: an approval is resolved exactly once (but for the restart below), and the only way to
``approved`` is an explicit ``resolve`` through a human channel or memory
before ``expires_at`` -- and, for an approval only an operator may give
(``approver`` ``operator``: a rule's ``approval: operator``, a changed pin),
only through a channel of operator strength. Everything else ends in a refusal: the timeout
(``expired``, ``system:timeout``), a restart of the gateway (every row still
pending that the starting gateway may end -- its own, one without an owner, one of a gateway known
to have ended, ``_restart_scope``; never one of another gateway still running on the same file or
database -- becomes ``expired``, ``system:restart``: the call that waited is gone, and nothing may
approve it later; so does every such row approved but not yet used
by a call, if the argument binding key it was bound under is not the restarted
gateway's: no retry can match it any more, so it must not read as an approval
that still stands -- its reason names who approved it, and the trace chain
keeps both records), a question nobody is left to answer (the
client answered it with an error and no other channel reaches a person:
``expired``, ``system:unanswerable``), an answer that arrives after the deadline
(recorded as the timeout it is). Raw arguments are never stored; an approval
keeps the keyed HMAC digest of the arguments and their shape (keys and JSON
types, ``drawbridge.approval.shape``), and the key approval memory counts it
under (``memory_digest``: the shape digest, or a keyed digest of the shape and
the values of a rule's ``memory_key`` fields).

Theory of operation. ``ApprovalStore`` is the small interface the gateway,
the control plane and the CLI use; ``SqliteApprovalStore`` implements it on either backend
(``drawbridge.state.backend``: the SQLite file, or PostgreSQL shared by replicas).
Each method is one transaction. ``resolve`` runs under ``BEGIN IMMEDIATE``
and updates ``WHERE status = 'pending'``: of any number of racing resolvers,
in this process or another one sharing the file, exactly one changes the row
and every other gets ``AlreadyResolved`` carrying the winning state. Ids are
16 hex characters from an injected source; ``get`` and ``resolve`` take the id
or a unique prefix of at least 4 characters (``drawbridge.state.ids``).
``memory_counts`` feeds approval memory (``drawbridge.approval.memory``).

A malformed row (a field this code cannot read: a bad timestamp, an unknown status, a damaged
value) fails closed for that row alone: reading it by id raises ``StateUnavailable`` (it can be
neither resolved nor used), the lists and the expiries leave it out and log its id and the kind of
fault, and the expiries still end it when it was pending. One damaged row thus never refuses every
other approval, nor stops the gateway from starting.

What goes into the trace chain: ``Approval.request_record()`` when the
approval is created and ``Approval.resolution_record()`` when it ends, with
who (``resolved_by``), when, the channel, the strength that channel carries
(``drawbridge.approval.channels``) and the reason. The caller appends them;
this module does not write the chain.

Size. The queue is one module because its invariant is a property of one table: every state change
of an approval is one SQL statement here, next to the row type it reads back, so the only ways a
row leaves ``pending`` can be read in one place.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Protocol

from drawbridge.approval.channels import Channel, Strength, strength_of
from drawbridge.approval.memory import MemoryCounts, tally
from drawbridge.approval.shape import ArgumentShape
from drawbridge.canonical import escape_unsafe, is_sha256_digest, parse_hmac_digest
from drawbridge.policy.model import Approver
from drawbridge.state.ids import (
    AmbiguousId,
    IdSource,
    UnknownId,
    default_id_source,
    new_id,
    rows_by_prefix,
)
from drawbridge.state import instances
from drawbridge.state.backend import StateBackend
from drawbridge.state.sqlite import StateDB, StateError, StateUnavailable, from_db_time, to_db_time

DEFAULT_TIMEOUT: Final = timedelta(seconds=300)
MAX_TEXT: Final = 4096
"""Longest reason, resolver name, agent or tool name accepted (characters)."""
RESOLVED_BY_TIMEOUT: Final = "system:timeout"
RESOLVED_BY_RESTART: Final = "system:restart"
RESOLVED_BY_UNANSWERABLE: Final = "system:unanswerable"
_ID_ATTEMPTS: Final = 8
_NAME_IN_REASON: Final = 200
"""Longest approver name quoted in the reason of an approval voided by a restart (characters)."""


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"  # timeout or restart: a refusal nobody decided


# -- errors ------------------------------------------------------------------------------------


class ApprovalError(StateError):
    """Base of the approval store's own errors (storage failures are ``StateUnavailable``)."""


class InvalidApproval(ApprovalError, ValueError):
    """A submit or resolve with arguments the store refuses (named in the message)."""


class OperatorRequired(InvalidApproval):
    """An approval only an operator may give was answered through a channel of lesser strength."""


class ApprovalNotFound(UnknownId):
    """No approval has this id or prefix."""


class AmbiguousApprovalId(AmbiguousId):
    """Several approvals start with this prefix."""


class AlreadyResolved(ApprovalError):
    """The approval was resolved before this call; ``approval`` is its stored state."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(
            f"approval {approval.id} already resolved: {approval.status} by {approval.resolved_by}"
        )
        self.approval = approval


class ApprovalExpired(AlreadyResolved):
    """The answer came at or after ``expires_at``; the approval is now expired (a refusal)."""


# -- the value ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    agent: str
    tool: str
    args_digest: str
    args_shape: str | None
    shape_digest: str | None
    reason: str
    policy: str | None
    source_file: str | None
    rule_index: int | None
    injection_findings: tuple[str, ...]
    status: ApprovalStatus
    created_at: datetime
    expires_at: datetime
    resolved_by: str | None = None
    channel: Channel | None = None
    resolution_reason: str | None = None
    resolved_at: datetime | None = None
    approver: Approver = Approver.ANY
    """Who may approve: ``operator`` only through a channel of operator strength."""
    memory_digest: str | None = None
    """What approval memory counts this approval under (``approval.memory``): the shape's digest unless
    a rule's ``memory_key`` made it a keyed digest of the shape and values; None without a shape."""

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @property
    def pending(self) -> bool:
        return self.status is ApprovalStatus.PENDING

    @property
    def permits(self) -> bool:
        """True only for an approval that was approved: the one state that lets the call run."""
        return self.status is ApprovalStatus.APPROVED

    @property
    def injection_suspected(self) -> bool:
        return bool(self.injection_findings)

    @property
    def strength(self) -> Strength | None:
        return strength_of(self.channel) if self.channel is not None else None

    def remaining(self, now: datetime) -> timedelta:
        """Time left before the timeout; zero once due or resolved."""
        if not self.pending:
            return timedelta(0)
        return max(self.expires_at - now, timedelta(0))

    def request_record(self) -> dict[str, Any]:
        """Trace-chain body for ``approval_requested``: no argument values, only digest and shape."""
        body: dict[str, Any] = {
            "approval_id": self.id,
            "agent": self.agent,
            "tool": self.tool,
            "args_digest": self.args_digest,
            "reason": self.reason,
            "created_at": to_db_time(self.created_at),
            "expires_at": to_db_time(self.expires_at),
        }
        optional = {
            "args_shape_digest": self.shape_digest,
            "policy": self.policy,
            "source_file": self.source_file,
            "rule_index": self.rule_index,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.injection_findings:
            body["injection_findings"] = list(self.injection_findings)
        if self.approver is not Approver.ANY:
            body["approver"] = self.approver.value
        return body

    def resolution_record(self) -> dict[str, Any]:
        """Trace-chain body for ``approval_resolved``: who, when, channel, strength, reason, outcome."""
        if self.pending:
            raise ValueError(f"approval {self.id} is still pending")
        assert self.resolved_at is not None and self.channel is not None
        return {
            "approval_id": self.id,
            "agent": self.agent,
            "tool": self.tool,
            "args_digest": self.args_digest,
            "status": str(self.status),
            "outcome": "allow" if self.permits else "deny",
            "resolved_by": self.resolved_by or "",
            "channel": str(self.channel),
            "strength": str(strength_of(self.channel)),
            "reason": self.resolution_reason or "",
            "resolved_at": to_db_time(self.resolved_at),
        }


# -- the interface -----------------------------------------------------------------------------


class ApprovalStore(Protocol):
    """What the gateway, control plane and CLI need from an approval queue."""

    async def submit(
        self,
        *,
        agent: str,
        tool: str,
        args_digest: str,
        args_shape: ArgumentShape | None,
        reason: str,
        created_at: datetime,
        expires_at: datetime,
        policy: str | None = None,
        source_file: str | None = None,
        rule_index: int | None = None,
        injection_findings: Sequence[str] = (),
        approver: Approver = Approver.ANY,
        memory_digest: str | None = None,
    ) -> Approval: ...

    async def get(self, id_or_prefix: str) -> Approval: ...

    async def list(
        self, status: ApprovalStatus | str | None = None, *, limit: int | None = None
    ) -> list[Approval]: ...

    async def resolve(
        self,
        id_or_prefix: str,
        decision: ApprovalStatus | str,
        *,
        resolved_by: str,
        channel: Channel | str,
        reason: str = "",
        at: datetime,
    ) -> Approval: ...

    async def expire_due(self, now: datetime) -> list[Approval]: ...

    async def expire_unanswerable(self, id_or_prefix: str, reason: str, now: datetime) -> Approval: ...

    async def recover_after_restart(
        self, now: datetime, *, usable_since: datetime | None = None, key_id: str | None = None
    ) -> list[Approval]: ...

    async def memory_counts(self, agent: str, tool: str, memory_digest: str) -> MemoryCounts: ...


# -- SQLite ------------------------------------------------------------------------------------

logger = logging.getLogger("drawbridge.state")

_COLUMNS: Final = (
    "id, agent, tool, args_digest, args_shape, shape_digest, reason, policy, source_file, rule_index, "
    "injection, status, created_at, expires_at, resolved_by, channel, resolution_reason, resolved_at, "
    "approver, memory_digest"
)


def _text(value: object, field: str, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidApproval(f"{field} must be text, not {type(value).__name__}")
    if not empty_ok and not value:
        raise InvalidApproval(f"{field} must not be empty")
    if len(value) > MAX_TEXT:
        raise InvalidApproval(f"{field} is longer than {MAX_TEXT} characters")
    return value


def _optional_text(value: object, field: str) -> str | None:
    return None if value is None else _text(value, field)


def _row_to_approval(row: sqlite3.Row | tuple[Any, ...]) -> Approval:
    """Build the value from a row; a row this code cannot read is a storage failure, never a guess."""
    try:
        return _decode(row)
    except (ValueError, TypeError, KeyError) as exc:
        raise StateUnavailable(
            f"approval row {str(row[0])[:16]!r} is malformed ({type(exc).__name__}); refusing to use it"
        ) from None


def _readable(rows: Iterable[sqlite3.Row | tuple[Any, ...]]) -> list[Approval]:
    """The rows this code can read, in order; each malformed one is left out and logged (its id and the
    kind of fault, never its contents). A malformed row is never acted on -- it cannot be approved,
    used or shown as pending -- but it no longer stops every other approval from being read."""
    readable = []
    for row in rows:
        try:
            readable.append(_row_to_approval(row))
        except StateUnavailable as exc:
            logger.error("%s; left out of the approvals read", exc)
    return readable


def _decode(row: sqlite3.Row | tuple[Any, ...]) -> Approval:
    (
        id_, agent, tool, args_digest, args_shape, shape_digest, reason, policy, source_file, rule_index,
        injection, status, created_at, expires_at, resolved_by, channel, resolution_reason, resolved_at,
        approver, memory_digest,
    ) = row
    return Approval(
        id=id_,
        agent=agent,
        tool=tool,
        args_digest=args_digest,
        args_shape=args_shape,
        shape_digest=shape_digest,
        reason=reason,
        policy=policy,
        source_file=source_file,
        rule_index=rule_index,
        injection_findings=_findings(injection),
        status=ApprovalStatus(status),
        created_at=from_db_time(created_at),
        expires_at=from_db_time(expires_at),
        resolved_by=resolved_by,
        channel=Channel(channel) if channel is not None else None,
        resolution_reason=resolution_reason,
        resolved_at=from_db_time(resolved_at) if resolved_at is not None else None,
        approver=Approver(approver),
        memory_digest=memory_digest,
    )


def _findings(text: str) -> tuple[str, ...]:
    if not text:
        return ()
    names = json.loads(text)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("injection findings are not a list of names")
    return tuple(names)


def _find(conn: sqlite3.Connection, id_or_prefix: str) -> Approval:
    prefix, rows = rows_by_prefix(conn, "approvals", _COLUMNS, id_or_prefix, "approval")
    if not rows:
        raise ApprovalNotFound("approval", f"no approval with id {prefix}")
    if len(rows) > 1:
        raise AmbiguousApprovalId(
            "approval", f"approval id prefix {prefix} matches several approvals; give more characters"
        )
    return _row_to_approval(rows[0])


def _expire(
    conn: sqlite3.Connection, where: str, params: tuple[Any, ...], by: str, reason: str, now: str
) -> list[Approval]:
    """Expire the pending approvals selected by ``where``; return them as stored afterwards."""
    rows = conn.execute(
        f"SELECT id FROM approvals WHERE status = 'pending' AND {where} ORDER BY created_at, id", params
    ).fetchall()
    ids = [r[0] for r in rows]
    for approval_id in ids:
        conn.execute(
            "UPDATE approvals SET status = 'expired', resolved_by = ?, channel = ?, resolution_reason = ?, "
            "resolved_at = ? WHERE id = ? AND status = 'pending'",
            (by, str(Channel.SYSTEM), reason, now, approval_id),
        )
    select = f"SELECT {_COLUMNS} FROM approvals WHERE id = ?"
    return _readable(conn.execute(select, (i,)).fetchone() for i in ids)  # a malformed one is expired all the same


def _void_unused(
    conn: sqlite3.Connection, mine: tuple[str, tuple[Any, ...]], usable_since: str, key_id: str, now: str
) -> list[Approval]:
    """Expire (``system:restart``) every approval of ``mine`` approved at or after ``usable_since``,
    not by memory, that no call has used and whose argument digest is keyed under another key than
    ``key_id``: a retry's digest can never equal it, so it can no longer let a call through."""
    rows = conn.execute(
        "SELECT a.id, a.args_digest, a.resolved_by, a.channel, a.resolved_at FROM approvals a "
        "WHERE a.status = 'approved' AND a.resolved_at >= ? AND (a.channel IS NULL OR a.channel != 'memory') "
        f"AND NOT EXISTS (SELECT 1 FROM approval_uses u WHERE u.approval_id = a.id) AND ({mine[0]}) "
        "ORDER BY a.resolved_at, a.id",
        (usable_since, *mine[1]),
    ).fetchall()
    voided = []
    for approval_id, digest, by, channel, resolved_at in rows:
        parsed = parse_hmac_digest(digest)
        if parsed is not None and parsed[0] == key_id:
            continue  # bound under the key this gateway binds with (shared by replicas): still usable
        reason = (
            f"approved by {escape_unsafe(str(by)[:_NAME_IN_REASON])} through {channel} at {resolved_at}, but no call used "
            "it before the gateway restarted; it was bound to the call's arguments under the previous process's "
            "key, so no retry can use it any more"
        )
        conn.execute(
            "UPDATE approvals SET status = 'expired', resolved_by = ?, channel = ?, resolution_reason = ?, "
            "resolved_at = ? WHERE id = ? AND status = 'approved'",
            (RESOLVED_BY_RESTART, str(Channel.SYSTEM), reason, now, approval_id),
        )
        voided.extend(_readable(conn.execute(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (approval_id,))))
    return voided


def _restart_scope(
    conn: sqlite3.Connection, db: StateBackend, since: str | None
) -> tuple[str, tuple[Any, ...]]:
    """The rows a start may end: those without an owner, this gateway's own (a replica's ``replica.id``),
    and on a SQLite file those of gateways no longer running on it (``state.instances``); on a shared
    database without a replica id, every row."""
    if not isinstance(db, StateDB):
        return ("replica IS NULL OR replica = ?", (db.replica_id,)) if db.replica_id else ("1 = 1", ())
    approved = ("OR (status = 'approved' AND resolved_at >= ?)", (since,)) if since is not None else ("", ())
    owners = [row[0] for row in conn.execute(
        "SELECT DISTINCT replica FROM approvals WHERE replica IS NOT NULL "
        f"AND (status = 'pending' {approved[0]})",
        approved[1],
    )]
    ended = [*([db.replica_id] if db.replica_id else []), *instances.gone(db.path, owners)]
    marks = ", ".join("?" * len(ended))
    return (f"replica IS NULL OR replica IN ({marks})" if ended else "replica IS NULL"), tuple(ended)


class SqliteApprovalStore:
    """``ApprovalStore`` on the embedded SQLite database. See the module docstring."""

    def __init__(self, db: StateBackend, *, id_source: IdSource = default_id_source) -> None:
        self._db = db
        self._id_source = id_source

    async def submit(
        self,
        *,
        agent: str,
        tool: str,
        args_digest: str,
        args_shape: ArgumentShape | None,
        reason: str,
        created_at: datetime,
        expires_at: datetime,
        policy: str | None = None,
        source_file: str | None = None,
        rule_index: int | None = None,
        injection_findings: Sequence[str] = (),
        approver: Approver = Approver.ANY,
        memory_digest: str | None = None,
    ) -> Approval:
        """Queue a call for a person; returns the pending approval with its new id. ``memory_digest``
        defaults to the shape's digest (memory counts by shape alone)."""
        _text(agent, "agent")
        _text(tool, "tool")
        if parse_hmac_digest(args_digest) is None:
            raise InvalidApproval(
                "args_digest must be a keyed digest hmac-sha256:<key_id>:<64 hex>; "
                "raw arguments and unkeyed digests are not stored"
            )
        if args_shape is not None:
            if not isinstance(args_shape, ArgumentShape) or not is_sha256_digest(args_shape.digest):
                raise InvalidApproval("args_shape must be an ArgumentShape from drawbridge.approval.shape")
        _text(reason, "reason")
        _optional_text(policy, "policy")
        _optional_text(source_file, "source_file")
        if rule_index is not None and (
            isinstance(rule_index, bool) or not isinstance(rule_index, int) or rule_index < 0
        ):
            raise InvalidApproval("rule_index must be a non-negative integer")
        findings = tuple(injection_findings)
        if not all(isinstance(f, str) and f.isascii() and f for f in findings):
            raise InvalidApproval("injection_findings must be pattern names")
        created, expires = to_db_time(created_at), to_db_time(expires_at)
        if expires_at <= created_at:
            raise InvalidApproval("expires_at must be later than created_at")
        injection = json.dumps(list(findings)) if findings else ""
        try:
            who = Approver(approver)
        except ValueError:
            raise InvalidApproval("approver must be 'any' or 'operator'") from None
        if memory_digest is None and args_shape is not None:
            memory_digest = args_shape.digest
        if memory_digest is not None and not (is_sha256_digest(memory_digest) or parse_hmac_digest(memory_digest)):
            raise InvalidApproval("memory_digest must be a sha256 digest or a keyed digest")

        def insert(conn: sqlite3.Connection) -> Approval:
            for _ in range(_ID_ATTEMPTS):
                approval_id = new_id(self._id_source, "approval")
                try:
                    conn.execute(
                        f"INSERT INTO approvals ({_COLUMNS}, replica) VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, NULL, NULL, NULL, NULL, ?, ?, ?)",
                        (
                            approval_id, agent, tool, args_digest,
                            args_shape.text if args_shape else None,
                            args_shape.digest if args_shape else None,
                            reason, policy, source_file, rule_index, injection, created, expires,
                            who.value, memory_digest, self._db.replica_id,
                        ),
                    )
                except sqlite3.IntegrityError:
                    if conn.execute("SELECT 1 FROM approvals WHERE id = ?", (approval_id,)).fetchone():
                        continue  # id collision: draw again
                    raise
                return _find(conn, approval_id)
            raise ApprovalError(f"could not draw an unused approval id in {_ID_ATTEMPTS} attempts")

        return await self._db.write(insert, "submit approval")

    async def get(self, id_or_prefix: str) -> Approval:
        return await self._db.read(lambda conn: _find(conn, id_or_prefix), "read approval")

    async def list(
        self, status: ApprovalStatus | str | None = None, *, limit: int | None = None
    ) -> list[Approval]:
        """Approvals, most recent first; only those with ``status`` when given."""
        where, params = "", ()
        if status is not None:
            where, params = "WHERE status = ?", (str(ApprovalStatus(status)),)
        limit_sql = ""
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidApproval("limit must be a positive integer")
            limit_sql = f" LIMIT {limit}"
        sql = f"SELECT {_COLUMNS} FROM approvals {where} ORDER BY created_at DESC, id DESC{limit_sql}"
        return await self._db.read(lambda conn: _readable(conn.execute(sql, params)), "list approvals")

    async def resolve(
        self,
        id_or_prefix: str,
        decision: ApprovalStatus | str,
        *,
        resolved_by: str,
        channel: Channel | str,
        reason: str = "",
        at: datetime,
    ) -> Approval:
        """Approve or deny a pending approval, exactly once.

        Raises ``AlreadyResolved`` (with the stored state) when it was resolved before, and
        ``ApprovalExpired`` when ``at`` is at or past ``expires_at``: the approval is then recorded
        as expired, because the timeout ends in deny whatever answer arrives late.
        """
        try:
            status = ApprovalStatus(decision)
        except ValueError:
            raise InvalidApproval("decision must be 'approved' or 'denied'") from None
        if status not in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
            raise InvalidApproval("decision must be 'approved' or 'denied'")
        try:
            via = Channel(channel)
        except ValueError:
            known = ", ".join(c.value for c in Channel)
            raise InvalidApproval(f"unknown approval channel; one of {known}") from None
        if via is Channel.SYSTEM:
            raise InvalidApproval("the system channel only expires approvals; it cannot resolve them")
        if via is Channel.MEMORY and status is not ApprovalStatus.APPROVED:
            raise InvalidApproval("approval memory only approves; it never denies")
        _text(resolved_by, "resolved_by")
        _text(reason, "reason", empty_ok=True)
        when = to_db_time(at)

        def update(conn: sqlite3.Connection) -> tuple[Approval, bool]:
            current = _find(conn, id_or_prefix)
            if not current.pending:
                return current, False
            if (
                current.approver is Approver.OPERATOR
                and status is ApprovalStatus.APPROVED
                and strength_of(via) is not Strength.OPERATOR
            ):
                raise OperatorRequired(
                    f"approval {current.short_id} may be approved only by an operator (console, CLI, control "
                    f"plane), not through the {via.value} channel"
                )
            if at >= current.expires_at:
                (expired,) = _expire(
                    conn, "id = ?", (current.id,), RESOLVED_BY_TIMEOUT,
                    "no decision before the approval timed out; a late answer does not count", when,
                )
                return expired, False
            cursor = conn.execute(
                "UPDATE approvals SET status = ?, resolved_by = ?, channel = ?, resolution_reason = ?, "
                "resolved_at = ? WHERE id = ? AND status = 'pending'",
                (str(status), resolved_by, str(via), reason, when, current.id),
            )
            if cursor.rowcount != 1:  # impossible under BEGIN IMMEDIATE; refuse rather than guess
                raise ApprovalError(f"approval {current.id} changed during resolve")
            return _find(conn, current.id), True

        approval, won = await self._db.write(update, "resolve approval")
        if won:
            return approval
        if approval.status is ApprovalStatus.EXPIRED and approval.resolved_by == RESOLVED_BY_TIMEOUT:
            raise ApprovalExpired(approval)
        raise AlreadyResolved(approval)

    async def expire_due(self, now: datetime) -> list[Approval]:
        """Expire every pending approval whose ``expires_at`` is at or before ``now``; return them."""
        when = to_db_time(now)
        return await self._db.write(
            lambda conn: _expire(
                conn, "expires_at <= ?", (when,), RESOLVED_BY_TIMEOUT,
                "no decision before the approval timed out", when,
            ),
            "expire approvals",
        )

    async def expire_unanswerable(self, id_or_prefix: str, reason: str, now: datetime) -> Approval:
        """End one pending approval that nobody can answer any more (``system:unanswerable``,
        channel ``system``), instead of letting its call wait for the timeout; return it as stored
        (unchanged when it was no longer pending: whoever resolved it first stands)."""
        _text(reason, "reason")
        when = to_db_time(now)

        def update(conn: sqlite3.Connection) -> Approval:
            current = _find(conn, id_or_prefix)
            expired = _expire(conn, "id = ?", (current.id,), RESOLVED_BY_UNANSWERABLE, reason, when)
            return expired[0] if expired else current

        return await self._db.write(update, "expire an unanswerable approval")

    async def recover_after_restart(
        self, now: datetime, *, usable_since: datetime | None = None, key_id: str | None = None
    ) -> list[Approval]:
        """At gateway startup: every approval still pending becomes expired (``system:restart``), and
        so does every one approved at or after ``usable_since`` that no call used, unless its argument
        digest is keyed under ``key_id`` (the key the restarted gateway binds arguments with).

        The call that waited died with the previous process; approving it later would approve a call nobody
        waits for. An approved one its retry never picked up can no longer be picked up (the retry's digest
        is keyed anew), so it must not go on reading ``approved``. The gateway calls this once, before it
        accepts calls; it ends only what it asked, what has no owner, and on a SQLite file what gateways
        no longer running asked (``_restart_scope``), never another running gateway's.
        """
        when = to_db_time(now)
        since = to_db_time(usable_since) if usable_since is not None else None

        def recover(conn: sqlite3.Connection) -> list[Approval]:
            mine = _restart_scope(conn, self._db, since)
            expired = _expire(
                conn, f"({mine[0]})", mine[1], RESOLVED_BY_RESTART,
                "the gateway restarted while the approval was pending; a pending approval never "
                "survives a restart", when,
            )
            if since is None or key_id is None:
                return expired
            return expired + _void_unused(conn, mine, since, key_id, when)

        return await self._db.write(recover, "recover approvals after restart")

    async def memory_counts(self, agent: str, tool: str, memory_digest: str) -> MemoryCounts:
        """Past resolutions of (agent, tool, memory key), counted for approval memory."""
        sql = (
            "SELECT status, channel, count(*) FROM approvals "
            "WHERE agent = ? AND tool = ? AND memory_digest = ? AND status != 'pending' "
            "GROUP BY status, channel"
        )
        rows = await self._db.read(
            lambda conn: conn.execute(sql, (agent, tool, memory_digest)).fetchall(),
            "count approvals for memory",
        )
        return tally(rows)


__all__ = [
    "DEFAULT_TIMEOUT",
    "RESOLVED_BY_RESTART",
    "RESOLVED_BY_UNANSWERABLE",
    "RESOLVED_BY_TIMEOUT",
    "AlreadyResolved",
    "AmbiguousApprovalId",
    "Approval",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalStatus",
    "ApprovalStore",
    "InvalidApproval",
    "OperatorRequired",
    "SqliteApprovalStore",
]
