"""The approval queue on a real SQLite file and a real PostgreSQL database (``state``): ids and prefixes,
exactly-once resolution, timeout, restart; racing connections and damaged files on SQLite."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import scaled

from drawbridge.approval.channels import Channel, Strength
from drawbridge.approval.shape import argument_shape
from drawbridge.state.approvals import (
    DEFAULT_TIMEOUT,
    AlreadyResolved,
    AmbiguousApprovalId,
    Approval,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalStatus,
    InvalidApproval,
    SqliteApprovalStore,
)
from drawbridge.state.approval_uses import SqliteApprovalUses
from drawbridge.state.ids import InvalidId
from drawbridge.state.instances import instances_dir
from drawbridge.state.backend import StateBackend, open_backend
from drawbridge.state.sqlite import StateDB, StateUnavailable

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
KEY = b"test-key-0123456789abcdef"


def keyed_digest(arguments: dict[str, Any]) -> str:
    """The gateway's keyed argument digest, re-done here with hashlib/hmac over sorted compact JSON."""
    body = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "hmac-sha256:k1:" + hmac.new(KEY, body, hashlib.sha256).hexdigest()


def scripted_ids(*ids: str) -> Iterator[str]:
    return iter(ids)


def open_store(path: Path | str, ids: Iterator[str] | None = None) -> tuple[StateBackend, SqliteApprovalStore]:
    db = open_backend(str(path))
    if ids is None:
        return db, SqliteApprovalStore(db)
    return db, SqliteApprovalStore(db, id_source=lambda: next(ids))


async def submit(
    store: SqliteApprovalStore, arguments: dict[str, Any] | None = None, **overrides: Any
) -> Approval:
    arguments = {"path": "/etc/hosts"} if arguments is None else arguments
    fields: dict[str, Any] = dict(
        agent="ci-bot",
        tool="fs.write_file",
        args_digest=keyed_digest(arguments),
        args_shape=argument_shape(arguments),
        reason='policy "ci" rule 2: human_approval',
        policy="ci",
        source_file="policies/ci.yaml",
        rule_index=2,
        created_at=T0,
        expires_at=T0 + DEFAULT_TIMEOUT,
    )
    fields.update(overrides)
    return await store.submit(**fields)


async def test_submit_persists_digest_and_shape_never_the_values(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db, store = open_store(path, scripted_ids("0123456789abcdef"))
    arguments = {"path": "/srv/app/.env", "content": "API_TOKEN=hunter2-secret-value", "mode": 384}
    approval = await submit(store, arguments, injection_findings=("disregard",))
    assert approval.id == "0123456789abcdef" and approval.short_id == "01234567"
    assert approval.status is ApprovalStatus.PENDING and approval.pending and not approval.permits
    assert approval.args_shape == '{"content":"string","mode":"number","path":"string"}'
    assert approval.shape_digest == "sha256:" + hashlib.sha256(approval.args_shape.encode()).hexdigest()
    assert approval.args_digest == keyed_digest(arguments)
    assert (approval.policy, approval.source_file, approval.rule_index) == ("ci", "policies/ci.yaml", 2)
    assert approval.injection_findings == ("disregard",) and approval.injection_suspected
    assert approval.expires_at - approval.created_at == timedelta(seconds=300)
    resolved = await store.resolve(
        approval.id, "approved", resolved_by="cli:ops", channel="cli", at=T0, reason="ok"
    )
    assert resolved.permits
    db.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"hunter2" not in stored and b"/srv/app" not in stored
    assert approval.args_digest.encode() in stored  # the digest is what is kept


@pytest.mark.parametrize(
    "digest",
    [
        "sha256:" + "0" * 64,  # unkeyed: a dictionary attack away from the value
        '{"path": "/etc/hosts"}',
        "hmac-sha256:k1:" + "0" * 63,
        "hmac-sha256::" + "0" * 64,
    ],
)
async def test_submit_refuses_anything_but_a_keyed_digest(state: str, digest: str) -> None:
    db, store = open_store(state)
    with pytest.raises(InvalidApproval, match="keyed digest"):
        await submit(store, args_digest=digest)
    assert await store.list() == []
    db.close()


async def test_submit_validation(state: str) -> None:
    db, store = open_store(state)
    with pytest.raises(InvalidApproval, match="later than created_at"):
        await submit(store, expires_at=T0)
    with pytest.raises(InvalidApproval, match="agent must not be empty"):
        await submit(store, agent="")
    with pytest.raises(InvalidApproval, match="rule_index"):
        await submit(store, rule_index=-1)
    with pytest.raises(ValueError, match="timezone-aware"):
        await submit(store, created_at=datetime(2026, 1, 1), expires_at=datetime(2026, 1, 2))
    db.close()


async def test_id_source_collision_draws_again_and_bad_ids_are_refused(state: str) -> None:
    ids = scripted_ids("aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")
    db, store = open_store(state, ids)
    first = await submit(store)
    second = await submit(store)
    assert (first.id, second.id) == ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")
    bad = SqliteApprovalStore(db, id_source=lambda: "ABCDEF0123456789")
    with pytest.raises(ValueError, match="16 lowercase hex"):
        await submit(bad)
    db.close()


async def test_default_ids_are_16_random_hex(state: str) -> None:
    db, store = open_store(state)
    ids = {(await submit(store)).id for _ in range(20)}
    assert len(ids) == 20 and all(len(i) == 16 and set(i) <= set("0123456789abcdef") for i in ids)
    db.close()


async def test_prefix_resolution(state: str) -> None:
    db, store = open_store(
        state, scripted_ids("abcd000000000000", "abcd111111111111", "ffee000000000000")
    )
    a, b, c = [await submit(store) for _ in range(3)]
    assert (await store.get("abcd0")).id == a.id
    assert (await store.get("ABCD1")).id == b.id  # typed in capitals
    assert (await store.get("ffee")).id == c.id
    with pytest.raises(InvalidId, match="holds whitespace"):  # malformed, never trimmed into another id
        await store.get(" ffee ")
    assert (await store.get(a.id)).id == a.id
    with pytest.raises(AmbiguousApprovalId, match="several"):
        await store.get("abcd")
    with pytest.raises(ApprovalNotFound, match="no approval with id 1234"):
        await store.get("1234")
    with pytest.raises(InvalidId, match="too short"):
        await store.get("abc")
    with pytest.raises(InvalidId, match="not hexadecimal"):
        await store.get("abcz")
    with pytest.raises(InvalidId, match="longer than 16"):
        await store.get(a.id + "0")
    # Distinct errors: an ambiguous prefix is not reported as "not found", nor the reverse.
    assert not issubclass(AmbiguousApprovalId, ApprovalNotFound)
    assert not issubclass(ApprovalNotFound, AmbiguousApprovalId)
    # Resolve takes a prefix too, and refuses an ambiguous one without touching either approval.
    with pytest.raises(AmbiguousApprovalId):
        await store.resolve("abcd", "approved", resolved_by="cli:ops", channel="cli", at=T0)
    assert all(x.pending for x in await store.list())
    db.close()


async def test_resolve_exactly_once_with_who_when_channel_reason(state: str) -> None:
    db, store = open_store(state)
    approval = await submit(store)
    at = T0 + timedelta(seconds=42)
    denied = await store.resolve(
        approval.short_id, ApprovalStatus.DENIED, resolved_by="console:alice", channel=Channel.CONSOLE,
        reason="not on a Friday", at=at,
    )
    assert denied.status is ApprovalStatus.DENIED and not denied.permits
    assert (denied.resolved_by, denied.channel, denied.resolution_reason, denied.resolved_at) == (
        "console:alice", Channel.CONSOLE, "not on a Friday", at,
    )
    assert denied.strength is Strength.OPERATOR
    assert denied.resolution_record() == {
        "approval_id": approval.id,
        "agent": "ci-bot",
        "tool": "fs.write_file",
        "args_digest": approval.args_digest,
        "status": "denied",
        "outcome": "deny",
        "resolved_by": "console:alice",
        "channel": "console",
        "strength": "operator",
        "reason": "not on a Friday",
        "resolved_at": "2026-05-01T12:00:42.000000Z",
    }
    with pytest.raises(AlreadyResolved) as info:
        await store.resolve(approval.id, "approved", resolved_by="cli:bob", channel="cli", at=at)
    assert info.value.approval.status is ApprovalStatus.DENIED
    assert (await store.get(approval.id)).resolved_by == "console:alice"
    db.close()


async def test_elicitation_answer_is_client_strength(state: str) -> None:
    db, store = open_store(state)
    approval = await submit(store)
    done = await store.resolve(
        approval.id, "approved", resolved_by="client:claude-code", channel="elicitation", at=T0
    )
    assert done.strength is Strength.CLIENT
    assert done.resolution_record()["strength"] == "client"
    db.close()


@pytest.mark.parametrize(
    ("decision", "channel", "message"),
    [
        ("maybe", "cli", "approved' or 'denied"),
        ("pending", "cli", "approved' or 'denied"),
        ("expired", "cli", "approved' or 'denied"),
        ("approved", "system", "system channel"),
        ("denied", "memory", "never denies"),
        ("approved", "carrier-pigeon", "unknown approval channel"),
    ],
)
async def test_resolve_refuses_what_it_must_not_record(
    state: str, decision: str, channel: str, message: str
) -> None:
    db, store = open_store(state)
    approval = await submit(store)
    with pytest.raises(InvalidApproval, match=message):
        await store.resolve(approval.id, decision, resolved_by="x", channel=channel, at=T0)
    assert (await store.get(approval.id)).pending
    db.close()


async def test_racing_resolvers_in_one_process_exactly_one_wins(state: str) -> None:
    db, store = open_store(state)
    approval = await submit(store)
    winners: list[Approval] = []
    losers: list[AlreadyResolved] = []

    async def racer(n: int) -> None:
        decision = "approved" if n % 2 else "denied"
        try:
            winners.append(
                await store.resolve(approval.id, decision, resolved_by=f"cli:r{n}", channel="cli", at=T0)
            )
        except AlreadyResolved as exc:
            losers.append(exc)

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(racer, n)
    assert len(winners) == 1 and len(losers) == 39
    stored = await store.get(approval.id)
    assert (stored.status, stored.resolved_by) == (winners[0].status, winners[0].resolved_by)
    assert all(exc.approval.resolved_by == stored.resolved_by for exc in losers)
    db.close()


def test_racing_resolvers_across_connections_exactly_one_wins(tmp_path: Path) -> None:
    """Several processes share the file (gateway, CLI, control plane): each racer has its own connection."""
    path = tmp_path / "state.db"
    db, store = open_store(path)
    approval = anyio.run(submit, store)
    db.close()
    racers = 8
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def racer(n: int) -> None:
        own = StateDB.open(path, busy_timeout=10.0)
        own_store = SqliteApprovalStore(own)
        barrier.wait()
        try:
            anyio.run(
                lambda: own_store.resolve(approval.id, "approved", resolved_by=f"p{n}", channel="cli", at=T0)
            )
            result = f"won:p{n}"
        except AlreadyResolved:
            result = "lost"
        finally:
            own.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [o for o in outcomes if o.startswith("won")]
    assert len(won) == 1 and outcomes.count("lost") == racers - 1
    db, store = open_store(path)
    assert (anyio.run(store.get, approval.id)).resolved_by == won[0].removeprefix("won:")
    db.close()


async def test_timeout_ends_in_expired_never_approved(state: str) -> None:
    db, store = open_store(state)
    approval = await submit(store)
    assert approval.remaining(T0 + timedelta(seconds=100)) == timedelta(seconds=200)
    assert await store.expire_due(T0 + timedelta(seconds=299)) == []
    due = T0 + timedelta(seconds=300)
    (expired,) = await store.expire_due(due)
    assert (expired.id, expired.status, expired.resolved_by, expired.channel) == (
        approval.id, ApprovalStatus.EXPIRED, "system:timeout", Channel.SYSTEM,
    )
    assert expired.resolved_at == due and not expired.permits and expired.remaining(due) == timedelta(0)
    assert expired.resolution_record()["outcome"] == "deny"
    assert expired.resolution_record()["strength"] == "system"
    with pytest.raises(ApprovalExpired):
        await store.resolve(approval.id, "approved", resolved_by="cli:late", channel="cli", at=due)
    assert await store.expire_due(due + timedelta(hours=1)) == []
    db.close()


async def test_late_answer_counts_as_the_timeout(state: str) -> None:
    """No sweeper ran, an approval arrives after the deadline: it is recorded as expired, not approved."""
    db, store = open_store(state)
    approval = await submit(store)
    with pytest.raises(ApprovalExpired) as info:
        await store.resolve(
            approval.id, "approved", resolved_by="cli:late", channel="cli", at=approval.expires_at
        )
    assert isinstance(info.value, AlreadyResolved)
    stored = await store.get(approval.id)
    assert stored.status is ApprovalStatus.EXPIRED and stored.resolved_by == "system:timeout"
    db.close()


async def test_an_unanswerable_approval_ends_as_expired_by_the_system_once(state: str) -> None:
    db, store = open_store(state)
    approval, other = await submit(store), await submit(store)
    at = T0 + timedelta(seconds=5)
    ended = await store.expire_unanswerable(approval.id[:6], "the client answered with an error", at)
    assert (ended.id, ended.status, ended.resolved_by, ended.channel, ended.resolved_at) == (
        approval.id, ApprovalStatus.EXPIRED, "system:unanswerable", Channel.SYSTEM, at,
    )
    assert ended.resolution_reason == "the client answered with an error" and not ended.permits
    assert ended.resolution_record()["outcome"] == "deny"
    assert (await store.get(other.id)).pending  # only that one
    with pytest.raises(AlreadyResolved):
        await store.resolve(approval.id, "approved", resolved_by="cli:ops", channel="cli", at=at)
    # Whoever resolved an approval first stands.
    await store.resolve(other.id, "approved", resolved_by="cli:ops", channel="cli", at=at)
    kept = await store.expire_unanswerable(other.id, "too late", at)
    assert kept.status is ApprovalStatus.APPROVED and kept.resolved_by == "cli:ops"
    with pytest.raises(InvalidApproval):
        await store.expire_unanswerable(other.id, "", at)
    db.close()


async def test_restart_turns_every_pending_approval_into_expired(state: str) -> None:
    path = state
    db, store = open_store(path)
    not_due = await submit(store, expires_at=T0 + timedelta(hours=1))
    overdue = await submit(store, expires_at=T0 + timedelta(seconds=1))
    approved = await submit(store)
    await store.resolve(approved.id, "approved", resolved_by="cli:ops", channel="cli", at=T0)
    db.close()  # the gateway stops

    db, store = open_store(path)  # and starts again
    restart = T0 + timedelta(seconds=30)
    recovered = await store.recover_after_restart(restart)
    assert {a.id for a in recovered} == {not_due.id, overdue.id}
    for a in recovered:
        assert (a.status, a.resolved_by, a.channel, a.resolved_at) == (
            ApprovalStatus.EXPIRED, "system:restart", Channel.SYSTEM, restart,
        )
        assert "restart" in (a.resolution_reason or "")
    assert (await store.get(approved.id)).status is ApprovalStatus.APPROVED
    with pytest.raises(AlreadyResolved):
        await store.resolve(not_due.id, "approved", resolved_by="cli:ops", channel="cli", at=restart)
    assert await store.recover_after_restart(restart) == []
    assert await store.list(ApprovalStatus.PENDING) == []
    db.close()


async def test_restart_expires_an_approval_no_call_used_unless_bound_under_the_gateways_own_key(state: str) -> None:
    db, store = open_store(state)
    unused, used, old = [await submit(store, {"path": p}) for p in ("/a", "/b", "/d")]
    shared = await submit(store, {"path": "/c"}, args_digest=keyed_digest({"path": "/c"}).replace(":k1:", ":k2:"))
    await store.resolve(old.id, "approved", resolved_by="cli:ops", channel="cli", at=T0)
    for approval in (unused, used, shared):
        await store.resolve(approval.id, "approved", resolved_by="cli:ops\u202e", channel="cli",
                            at=T0 + timedelta(seconds=10))
    assert await SqliteApprovalUses(db).claim(used.id, at=T0 + timedelta(seconds=20))
    db.close()  # the gateway stops

    db, store = open_store(state)  # and starts again, binding arguments under key k2
    restart = T0 + timedelta(seconds=30)
    recovered = await store.recover_after_restart(restart, usable_since=T0 + timedelta(seconds=5), key_id="k2")
    assert [a.id for a in recovered] == [unused.id]
    (voided,) = recovered
    assert (voided.status, voided.resolved_by, voided.channel, voided.resolved_at) == (
        ApprovalStatus.EXPIRED, "system:restart", Channel.SYSTEM, restart,
    )
    assert (voided.resolution_reason or "").startswith("approved by cli:ops\\u202e through cli at ")
    assert "no retry can use it any more" in (voided.resolution_reason or "")
    # Used, bound under the restarted gateway's own key (replicas share it), or past the retry window:
    # each is left as the person resolved it.
    for kept in (used, shared, old):
        assert (await store.get(kept.id)).status is ApprovalStatus.APPROVED
    db.close()


CRASHING_GATEWAY = """
import os, signal, sys
from datetime import UTC, datetime, timedelta
import anyio
from drawbridge.state.approvals import SqliteApprovalStore
from drawbridge.state.sqlite import StateDB

async def main():
    db = StateDB.open(sys.argv[1])
    db.hold_instance()
    at = datetime(2026, 5, 1, 12, tzinfo=UTC)
    approval = await SqliteApprovalStore(db).submit(
        agent="ci-bot", tool="fs.write_file", args_digest="hmac-sha256:k1:" + "0" * 64, args_shape=None,
        reason="rule 2", created_at=at, expires_at=at + timedelta(minutes=5),
    )
    print(approval.id, db.replica_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # a crash: the lock file stays, the kernel drops the lock

anyio.run(main)
"""


async def test_a_start_on_a_shared_file_ends_only_what_gateways_gone_asked(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_GATEWAY, str(path)],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    crashed_id, crashed_instance = crashed.stdout.split()
    assert (instances_dir(path) / f"{crashed_instance}.lock").exists()
    old_db, old_store = open_store(path)  # a row written before gateways recorded an instance id
    ownerless = await submit(old_store, {"path": "/old"})
    old_db.close()
    running = StateDB.open(path)
    running_instance = running.hold_instance()
    kept = await submit(SqliteApprovalStore(running), {"path": "/kept"})
    assert stat.S_IMODE((instances_dir(path) / f"{running_instance}.lock").stat().st_mode) == 0o600

    starting = StateDB.open(path)
    starting.hold_instance()
    restart = T0 + timedelta(seconds=30)
    recovered = await SqliteApprovalStore(starting).recover_after_restart(restart)
    assert sorted(a.id for a in recovered) == sorted([crashed_id, ownerless.id])
    assert all(a.resolved_by == "system:restart" for a in recovered)
    assert (await SqliteApprovalStore(starting).get(kept.id)).status is ApprovalStatus.PENDING
    assert not (instances_dir(path) / f"{crashed_instance}.lock").exists()  # stale: removed
    resolved = await SqliteApprovalStore(starting).resolve(
        kept.id, "approved", resolved_by="cli:ops", channel="cli", at=restart,
    )
    assert resolved.status is ApprovalStatus.APPROVED
    running.close()  # a clean stop removes its lock file; its approvals are then the next start's to end
    assert sorted(p.name for p in instances_dir(path).iterdir()) == [f"{starting.replica_id}.lock"]
    starting.close()


async def test_list_order_filter_and_limit(state: str) -> None:
    db, store = open_store(state)
    later = T0 + timedelta(hours=1)
    made = [await submit(store, created_at=T0 + timedelta(seconds=i), expires_at=later) for i in range(4)]
    await store.resolve(made[1].id, "denied", resolved_by="cli:ops", channel="cli", at=T0)
    assert [a.id for a in await store.list()] == [m.id for m in reversed(made)]
    assert [a.id for a in await store.list("pending")] == [made[3].id, made[2].id, made[0].id]
    assert [a.id for a in await store.list(ApprovalStatus.DENIED)] == [made[1].id]
    assert len(await store.list(limit=2)) == 2
    with pytest.raises(ValueError):
        await store.list("bogus")
    db.close()


async def test_request_record_carries_no_values(state: str) -> None:
    db, store = open_store(state, scripted_ids("00000000000000aa"))
    approval = await submit(store, {"query": "DROP TABLE users; -- secret-marker"})
    record = approval.request_record()
    assert record == {
        "approval_id": "00000000000000aa",
        "agent": "ci-bot",
        "tool": "fs.write_file",
        "args_digest": approval.args_digest,
        "args_shape_digest": "sha256:" + hashlib.sha256(b'{"query":"string"}').hexdigest(),
        "reason": 'policy "ci" rule 2: human_approval',
        "policy": "ci",
        "source_file": "policies/ci.yaml",
        "rule_index": 2,
        "created_at": "2026-05-01T12:00:00.000000Z",
        "expires_at": "2026-05-01T12:05:00.000000Z",
    }
    assert "secret-marker" not in json.dumps(record)
    with pytest.raises(ValueError, match="still pending"):
        approval.resolution_record()
    db.close()


async def test_memory_counts_are_scoped_to_agent_tool_and_shape(state: str) -> None:
    db, store = open_store(state)
    shape_args = {"path": "a"}
    channels = itertools.cycle(["cli", "control_plane", "elicitation"])
    for _ in range(3):
        a = await submit(store, shape_args)
        await store.resolve(a.id, "approved", resolved_by="x", channel=next(channels), at=T0)
    auto = await submit(store, shape_args)
    await store.resolve(auto.id, "approved", resolved_by="memory", channel="memory", at=T0)
    await submit(store, shape_args)  # still pending: not counted
    await submit(store, shape_args, expires_at=T0 + timedelta(seconds=1))
    await store.expire_due(T0 + timedelta(seconds=1))
    # Other agent, other tool, other shape: none of these count.
    other = await submit(store, shape_args, agent="other")
    await store.resolve(other.id, "denied", resolved_by="x", channel="cli", at=T0)
    other_tool = await submit(store, shape_args, tool="fs.read_file")
    await store.resolve(other_tool.id, "denied", resolved_by="x", channel="cli", at=T0)
    other_shape = await submit(store, {"path": "a", "force": True})
    await store.resolve(other_shape.id, "denied", resolved_by="x", channel="cli", at=T0)

    counts = await store.memory_counts("ci-bot", "fs.write_file", argument_shape({"path": "zzz"}).digest)
    assert (counts.operator_approvals, counts.client_approvals, counts.memory_approvals) == (2, 1, 1)
    assert (counts.denials, counts.expirations) == (0, 1)
    db.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [("status", "approved-ish"), ("channel", "pigeon"), ("created_at", "yesterday"), ("injection", "{}")],
)
async def test_a_row_this_code_cannot_read_is_unavailable_not_guessed(
    tmp_path: Path, column: str, value: str
) -> None:
    path = tmp_path / "state.db"
    db, store = open_store(path, scripted_ids("00000000000000ff"))
    approval = await submit(store)
    await store.resolve(approval.id, "approved", resolved_by="cli:ops", channel="cli", at=T0)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA ignore_check_constraints = ON")
    raw.execute(f"UPDATE approvals SET {column} = ?", (value,))
    raw.commit()
    raw.close()
    with pytest.raises(StateUnavailable, match="approval row '00000000000000ff' is malformed"):
        await store.get(approval.id)
    db.close()
