"""What makes a gateway one replica among several on a shared PostgreSQL state.

Invariant: a replica takes no call before its keys are known to match the other replicas' (the
key ring, ``state.key_ring``), and it acts on what another replica changed as soon as it is told:
an approval resolved on another replica wakes the call waiting here (the waiter reads the store,
so what it acts on is the stored resolution, never the notification), and pins accepted on another
replica are checked again here, so their floors hold on every replica. A lost notification
connection is re-established and followed by a resync (every waiter re-reads, every guarded server
is checked again), so nothing said while it was away is missed for longer than the reconnection.

Theory of operation. ``open_shared`` connects (``state.postgres``), migrates, checks and records
the key ring, and names the replica (``replica.id``, or ``replica-<random>``: a replica without a
stable id leaves the approvals it had pending at a crash to the timeout, which every replica's
sweeper applies), holding that name for its life (``PostgresDB.claim``): a second process under a
running replica's id does not start, so it never ends that replica's approvals as "of a previous run". ``approval_keys`` turns the configured rings into the approval engine's binding
key and ``requestState`` ring. ``follow`` runs beside the calls and dispatches the database's
notifications (``state.postgres_schema``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskStatus

from drawbridge.config_state import SharedState
from drawbridge.gateway.pipeline.approvals.engine import ApprovalEngine
from drawbridge.gateway.pipeline.approvals.gate import BindingKey
from drawbridge.gateway.pipeline.pins import CataloguePins
from drawbridge.state.key_ring import check_and_register
from drawbridge.state.postgres import PostgresDB
from drawbridge.state.postgres_schema import APPROVALS_CHANNEL, PINS_CHANNEL

logger = logging.getLogger("drawbridge.replicas")

BINDING_PURPOSE = "approval_binding"
REQUEST_STATE_PURPOSE = "request_state"


def replica_name(shared: SharedState) -> str:
    return shared.replica_id or f"replica-{secrets.token_hex(4)}"


def open_shared(shared: SharedState, replica_id: str) -> PostgresDB:
    """The shared database, migrated, with this replica's keys checked against the others';
    ``StateError`` (``StateUnavailable``, ``KeyRingMismatch``) says why not."""
    db = PostgresDB.open(shared.url, pool_size=shared.pool_size, replica_id=replica_id)
    try:
        db.claim(replica_id)
        check_and_register(
            db,
            {
                BINDING_PURPOSE: [(k.key_id, k.key) for k in shared.binding_keys],
                REQUEST_STATE_PURPOSE: [(k.key_id, k.key) for k in shared.request_state_keys],
            },
            by=replica_id,
            at=datetime.now(UTC),
        )
    except BaseException:
        db.close()
        raise
    return db


def approval_keys(shared: SharedState | None) -> dict[str, Any]:
    """The approval engine's keys from the configured rings (nothing: per process, SQLite's way)."""
    if shared is None:
        return {}
    first = shared.binding_keys[0]
    return {
        "binding_key": BindingKey(first.key, first.key_id),
        "state_keys": [k.key for k in shared.request_state_keys],
    }


async def follow(
    db: PostgresDB,
    engine: ApprovalEngine | None,
    pins: CataloguePins | None,
    on_pins: Sequence[Callable[[str], Awaitable[None]]] = (),
    prompt_pins: CataloguePins | None = None,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Act on the other replicas' changes, forever (module docstring). A pins notification names a
    server, not a kind: its tools and its prompts (``pin_prompts``) are both checked again."""
    guarded = [p for p in (pins, prompt_pins) if p is not None]

    async def pins_changed(server: str) -> None:
        checked = [p for p in guarded if server in p.servers()]
        for each in checked:
            await each.after_accept(server)
        for callback in on_pins if checked else ():
            await callback(server)

    async def on_event(channel: str, payload: str | None) -> None:
        try:
            if channel == APPROVALS_CHANNEL and engine is not None:
                engine.wake(payload)
            elif channel == PINS_CHANNEL and guarded:
                servers = {s for p in guarded for s in p.servers()}
                for server in [payload] if payload is not None else sorted(servers):
                    await pins_changed(server)
        except Exception as exc:  # noqa: BLE001 -- one failed reaction must not stop the others
            logger.warning("could not act on a change from another replica (%s)", type(exc).__name__)

    await db.listen([APPROVALS_CHANNEL, PINS_CHANNEL], on_event, task_status=task_status)


__all__ = ["approval_keys", "follow", "open_shared", "replica_name"]
