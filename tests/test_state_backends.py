"""The storage interface on both backends: a real SQLite file and a real PostgreSQL database.

Every test runs on each backend, and where replicas matter, on two handles of one store (two
``StateDB`` objects on one file, or two ``PostgresDB`` pools on one database), as two replicas are.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from drawbridge.state.approval_uses import SqliteApprovalUses
from drawbridge.state.approvals import AlreadyResolved, ApprovalStatus, SqliteApprovalStore
from drawbridge.state.backend import StateBackend, open_backend
from drawbridge.state.grants import SqliteGrantStore
from drawbridge.state.key_ring import KeyRingMismatch, check_and_register
from drawbridge.state.pins import SqlitePinStore, ToolDefinition
from drawbridge.state.postgres import PostgresDB, redacted, translate
from drawbridge.state.sqlite import SCHEMA_VERSION, StateUnavailable

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
KEY = b"k" * 32
Opener = Callable[[str | None], StateBackend]


def digest(arguments: dict[str, Any]) -> str:
    body = json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()
    return "hmac-sha256:k1:" + hmac.new(KEY, body, hashlib.sha256).hexdigest()


@pytest.fixture
def opener(state: str) -> Iterator[Opener]:
    """Opens a handle on one store per test and backend (call it again for a second replica's handle)."""
    opened: list[StateBackend] = []

    def open_one(replica: str | None = None) -> StateBackend:
        db = open_backend(state, pool_size=4, replica_id=replica)
        opened.append(db)
        return db

    yield open_one
    for db in opened:
        db.close()


async def submit(store: SqliteApprovalStore, arguments: dict[str, Any], at: datetime = T0) -> Any:
    return await store.submit(
        agent="agent-1", tool="github.delete_repo", args_digest=digest(arguments), args_shape=None,
        reason="rule 0", created_at=at, expires_at=at + timedelta(minutes=5),
    )


async def test_both_backends_migrate_to_the_same_version(opener: Opener) -> None:
    db = opener(None)
    assert db.schema_version() == SCHEMA_VERSION
    opener(None)  # a second open does not migrate again
    assert db.read_sync(lambda c: c.execute("SELECT count(*) FROM schema_version").fetchone()[0], "n") == SCHEMA_VERSION


async def test_a_schema_newer_than_this_code_is_refused(opener: Opener) -> None:
    db = opener(None)
    db.write_sync(
        lambda c: c.execute("INSERT INTO schema_version VALUES (?, ?, ?)", (99, "future", "2030-01-01T00:00:00.000000Z")),
        "future",
    )
    with pytest.raises(StateUnavailable, match=rf"schema version 99, newer than this drawbridge supports \({SCHEMA_VERSION}\)"):
        opener(None)


async def test_racing_resolvers_on_two_handles_resolve_once(opener: Opener) -> None:
    a, b = SqliteApprovalStore(opener("a")), SqliteApprovalStore(opener("b"))
    approval = await submit(a, {"name": "rocket"})
    outcomes: list[str] = []

    async def resolve(store: SqliteApprovalStore, decision: str, by: str) -> None:
        try:
            await store.resolve(approval.id, decision, resolved_by=by, channel="control_plane", at=T0)
            outcomes.append(by)
        except AlreadyResolved as exc:
            outcomes.append(f"lost to {exc.approval.resolved_by}")

    async with anyio.create_task_group() as tg:
        for index in range(6):
            store, decision = (a, "approved") if index % 2 else (b, "denied")
            tg.start_soon(resolve, store, decision, f"op-{index}")
    winners = [o for o in outcomes if not o.startswith("lost")]
    assert len(winners) == 1 and all(o == f"lost to {winners[0]}" for o in outcomes if o.startswith("lost"))
    assert (await b.get(approval.id[:6])).resolved_by == winners[0]


async def test_an_approval_is_used_by_one_call_across_handles(opener: Opener) -> None:
    db_a, db_b = opener("a"), opener("b")
    store = SqliteApprovalStore(db_a)
    approval = await submit(store, {"name": "rocket"})
    await store.resolve(approval.id, "approved", resolved_by="op", channel="control_plane", at=T0)
    claims: list[str | None] = []

    async def claim(uses: SqliteApprovalUses) -> None:
        claims.append(await uses.claim_resolved(
            "agent-1", "github.delete_repo", digest({"name": "rocket"}), since=T0 - timedelta(minutes=1), at=T0,
        ))

    async with anyio.create_task_group() as tg:
        for uses in itertools.islice(itertools.cycle([SqliteApprovalUses(db_a), SqliteApprovalUses(db_b)]), 6):
            tg.start_soon(claim, uses)
    assert [c for c in claims if c is not None] == [approval.id] and len(claims) == 6
    assert await SqliteApprovalUses(db_b).used(approval.id)


async def test_an_id_collision_draws_again_on_both_backends(opener: Opener) -> None:
    ids = iter(["00000000000000aa", "00000000000000aa", "00000000000000bb"])
    store = SqliteApprovalStore(opener(None), id_source=lambda: next(ids))
    first, second = await submit(store, {"n": 1}), await submit(store, {"n": 2})
    assert (first.id, second.id) == ("00000000000000aa", "00000000000000bb")


async def test_a_restart_expires_only_what_that_replica_asked(opener: Opener) -> None:
    a, b = SqliteApprovalStore(opener("a")), SqliteApprovalStore(opener("b"))
    mine, theirs = await submit(a, {"n": 1}), await submit(b, {"n": 2})
    restarted = SqliteApprovalStore(opener("a"))
    expired = await restarted.recover_after_restart(T0 + timedelta(seconds=1))
    assert [x.id for x in expired] == [mine.id]
    assert (await b.get(theirs.id)).status is ApprovalStatus.PENDING


async def test_grants_and_memory_counts_are_read_by_every_handle(opener: Opener) -> None:
    a, b = opener("a"), opener("b")
    grant = await SqliteGrantStore(a).create("agent-*", "github.*", T0 + timedelta(hours=1), "op", created_at=T0)
    assert (await SqliteGrantStore(b).active_for("agent-1", "github.delete_repo", T0)) == grant
    await SqliteGrantStore(b).revoke(grant.id[:5], revoked_by="op", at=T0 + timedelta(minutes=1))
    assert await SqliteGrantStore(a).active_for("agent-1", "github.delete_repo", T0 + timedelta(minutes=2)) is None
    store = SqliteApprovalStore(a)
    approval = await store.submit(
        agent="agent-1", tool="t", args_digest=digest({}), args_shape=None, reason="r", created_at=T0,
        expires_at=T0 + timedelta(minutes=5), memory_digest="sha256:" + "0" * 64,
    )
    await store.resolve(approval.id, "approved", resolved_by="op", channel="control_plane", at=T0)
    counts = await SqliteApprovalStore(b).memory_counts("agent-1", "t", "sha256:" + "0" * 64)
    assert counts.operator_approvals == 1


async def test_pins_pinned_on_one_handle_are_loaded_by_the_other(opener: Opener) -> None:
    a, b = SqlitePinStore(opener("a")), SqlitePinStore(opener("b"))
    tools = {"list": ToolDefinition("sha256:" + "1" * 64, "lists"), "drop": ToolDefinition("sha256:" + "2" * 64)}
    assert await a.trust_on_first_use("srv", tools, at=T0)
    assert not await b.trust_on_first_use("srv", tools, at=T0)
    changed = {**tools, "drop": ToolDefinition("sha256:" + "3" * 64, "now drops more")}
    await b.observe("srv", changed, at=T0)
    accepted = await a.accept("srv", ["drop"], accepted_by="op", at=T0)
    assert [c.name for c in accepted] == ["drop"]
    assert (await b.load("srv"))["drop"].fingerprint == "sha256:" + "3" * 64


async def test_a_replica_with_another_key_under_a_known_id_is_refused(opener: Opener) -> None:
    db = opener("a")
    check_and_register(db, {"request_state": [("s1", KEY)]}, by="a", at=T0)
    check_and_register(opener("b"), {"request_state": [("s1", KEY), ("s2", b"n" * 32)]}, by="b", at=T0)  # rotation
    with pytest.raises(KeyRingMismatch, match="request_state key 's1' differs") as refused:
        check_and_register(opener("c"), {"request_state": [("s1", b"x" * 32)]}, by="c", at=T0)
    assert "xxxx" not in str(refused.value)
    with pytest.raises(KeyRingMismatch, match="none of this replica's request_state key ids"):
        check_and_register(opener("d"), {"request_state": [("s9", b"y" * 32)]}, by="d", at=T0)


def test_the_sqlite_dialect_is_translated_for_postgresql() -> None:
    assert translate("SELECT 1 FROM t WHERE a = ? AND b LIKE '5%'") == "SELECT 1 FROM t WHERE a = %s AND b LIKE '5%%'"
    assert translate("INSERT OR IGNORE INTO u (a) VALUES (?)") == "INSERT INTO u (a) VALUES (%s) ON CONFLICT DO NOTHING"


def test_an_unreachable_database_is_a_one_line_refusal_without_its_password() -> None:
    with pytest.raises(StateUnavailable) as refused:
        PostgresDB.open("postgresql://drawbridge:s3cret@127.0.0.1:1/none", timeout=1)
    assert "s3cret" not in str(refused.value) and "\n" not in str(refused.value)
    assert "cannot connect to the state database postgresql://drawbridge:***@127.0.0.1:1/none" in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://drawbridge@127.0.0.1:1/none?password=S3cretPw",
        "postgresql://127.0.0.1:1/none?sslmode=disable&password=S3cretPw",
        "postgres://drawbridge:S3cretPw@127.0.0.1:1/none?passfile=/S3cretPw/pgpass",
        "postgresql://127.0.0.1:1?password=S3cretPw",
    ],
)
def test_a_password_in_any_part_of_the_url_is_never_shown(url: str) -> None:
    with pytest.raises(StateUnavailable) as refused:
        PostgresDB.open(url, timeout=1)
    assert "S3cretPw" not in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert "127.0.0.1:1" in str(refused.value)  # still says which database
    assert "S3cretPw" not in redacted(url) and "=***" in redacted(url)
