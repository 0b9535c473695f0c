"""Which resolved approvals have been used by a call: one approval, one call.

Invariant: a resolved approval is delivered to at most one tools/call, ever,
across concurrent callers, retries, restarts and processes sharing the state
file. "Delivered" means the call was run (approved) or was told the answer
(denied, expired). An approval nobody has used yet can be picked up by the
next identical call (same agent, tool and keyed argument digest) within a
window after its resolution; that is how a client that timed out while a
person decided gets its call run once the person approves, and how the
retried call learns of a denial.

Theory of operation. One row per used approval in ``approval_uses``
(primary key ``approval_id``). ``claim`` (a known approval) and
``claim_resolved`` (the oldest unused resolution for a call) each run in one
``BEGIN IMMEDIATE`` transaction: the SELECT and the INSERT cannot interleave
with another claimer, in this process or another, so of two racing retries
exactly one gets the approval. Approvals granted by memory are never handed
to another call: memory approves the call that asked, and that call claims
its row at once. ``find_pending`` lets a retry join the question already
open for the same call instead of asking the person twice.

The table is created by migration 2 of ``drawbridge.state.sqlite.MIGRATIONS``
(with ``IF NOT EXISTS``, so databases that created it before the migration
existed upgrade cleanly); the ledger also runs ``SCHEMA`` when it is built.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Final, Protocol

from drawbridge.approval.channels import STRENGTH, Strength
from drawbridge.state.backend import StateBackend
from drawbridge.state.sqlite import to_db_time

OPERATOR_CHANNELS: Final = ", ".join(f"'{c.value}'" for c, s in STRENGTH.items() if s is Strength.OPERATOR)
"""The channels of operator strength, as an SQL list (a fixed vocabulary, never input)."""

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS approval_uses (
        approval_id TEXT PRIMARY KEY REFERENCES approvals (id),
        used_at TEXT NOT NULL,
        outcome TEXT NOT NULL CHECK (outcome IN ('approved', 'denied', 'expired'))
    )""",
)


class ApprovalUses(Protocol):
    async def claim(self, approval_id: str, *, at: datetime) -> bool: ...

    async def claim_resolved(
        self, agent: str, tool: str, args_digest: str, *, since: datetime, at: datetime, operator_only: bool = False
    ) -> str | None: ...

    async def find_pending(
        self, agent: str, tool: str, args_digest: str, *, now: datetime, operator_only: bool = False
    ) -> str | None: ...

    async def used(self, approval_id: str) -> bool: ...


def _insert_use(conn: sqlite3.Connection, approval_id: str, when: str) -> bool:
    row = conn.execute("SELECT status FROM approvals WHERE id = ?", (approval_id,)).fetchone()
    if row is None or row[0] == "pending":
        return False  # nothing to use: unknown, or nobody has decided yet
    cursor = conn.execute(
        "INSERT OR IGNORE INTO approval_uses (approval_id, used_at, outcome) VALUES (?, ?, ?)",
        (approval_id, when, row[0]),
    )
    return cursor.rowcount == 1


class SqliteApprovalUses:
    """``ApprovalUses`` on the state database that holds the approvals table."""

    def __init__(self, db: StateBackend) -> None:
        self._db = db

        def create(conn: sqlite3.Connection) -> None:
            for statement in SCHEMA:
                conn.execute(statement)

        db.write_sync(create, "create approval_uses")

    async def claim(self, approval_id: str, *, at: datetime) -> bool:
        """Use this resolved approval; False if it is pending, unknown, or was used before."""
        when = to_db_time(at)
        return await self._db.write(lambda conn: _insert_use(conn, approval_id, when), "claim approval")

    async def claim_resolved(
        self, agent: str, tool: str, args_digest: str, *, since: datetime, at: datetime, operator_only: bool = False
    ) -> str | None:
        """Use the oldest unused resolution of this exact call resolved at or after ``since``; its id.
        ``operator_only``: an approval counts only when an operator gave it (a refusal always counts)."""
        low, when = to_db_time(since), to_db_time(at)
        sql = (
            "SELECT a.id FROM approvals a WHERE a.agent = ? AND a.tool = ? AND a.args_digest = ? "
            "AND a.status IN ('approved', 'denied', 'expired') AND a.resolved_at >= ? "
            "AND (a.channel IS NULL OR a.channel != 'memory') "
            + (f"AND (a.status != 'approved' OR a.channel IN ({OPERATOR_CHANNELS})) " if operator_only else "")
            + "AND NOT EXISTS (SELECT 1 FROM approval_uses u WHERE u.approval_id = a.id) "
            "ORDER BY a.resolved_at, a.id LIMIT 1"
        )

        def take(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(sql, (agent, tool, args_digest, low)).fetchone()
            if row is None:
                return None
            return row[0] if _insert_use(conn, row[0], when) else None

        return await self._db.write(take, "claim resolved approval")

    async def find_pending(
        self, agent: str, tool: str, args_digest: str, *, now: datetime, operator_only: bool = False
    ) -> str | None:
        """The oldest approval of this exact call still open at ``now`` that asks who this call asks
        (``operator_only``: an operator; else anyone)."""
        sql = (
            "SELECT id FROM approvals WHERE agent = ? AND tool = ? AND args_digest = ? "
            "AND status = 'pending' AND expires_at > ? AND approver = ? ORDER BY created_at, id LIMIT 1"
        )
        when = to_db_time(now)
        approver = "operator" if operator_only else "any"
        row = await self._db.read(
            lambda conn: conn.execute(sql, (agent, tool, args_digest, when, approver)).fetchone(),
            "find pending approval",
        )
        return None if row is None else row[0]

    async def used(self, approval_id: str) -> bool:
        row = await self._db.read(
            lambda conn: conn.execute(
                "SELECT 1 FROM approval_uses WHERE approval_id = ?", (approval_id,)
            ).fetchone(),
            "read approval use",
        )
        return row is not None


__all__ = ["ApprovalUses", "SqliteApprovalUses"]
