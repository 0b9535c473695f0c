"""The state database file: mode 0600, WAL, schema versions, refusing files not ours, off-loop I/O."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from drawbridge.canonical import sha256_prefixed
from drawbridge.state.pins import SqlitePinStore, ToolDefinition
from drawbridge.state.sqlite import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    StateDB,
    StateUnavailable,
    from_db_time,
    to_db_time,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_is_0600_wal_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = os.umask(0)  # even with a permissive umask the file must not be readable by others
    try:
        db = StateDB.open(path)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600
    db.write_sync(lambda c: c.execute("INSERT INTO pin_servers VALUES ('s', 'tool', 'x', 'y')"), "touch")
    wal = tmp_path / "state.db-wal"
    assert wal.exists() and _mode(wal) == 0o600
    assert db.schema_version() == SCHEMA_VERSION == 6
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        rows = raw.execute("SELECT version, name FROM schema_version").fetchall()
        assert rows == [
            (1, "approvals, grants, pins"),
            (2, "approval uses: each resolution delivered to one call"),
            (3, "who may approve (approval: operator), and the key approval memory counts under (memory_key)"),
            (4, "replicas: who asked, the shared key ring's fingerprints, shared rate-limit buckets"),
            (5, "pinned and observed tools keep their whole definition (what the fingerprint covers)"),
            (6, "pins and observations have a kind (tool or prompt): a tool and a prompt of one name never collide"),
        ]
    finally:
        raw.close()
        db.close()


def test_existing_wide_mode_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateDB.open(path).close()
    path.chmod(0o644)
    StateDB.open(path).close()
    assert _mode(path) == 0o600


def test_reopen_does_not_rerun_migrations(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    for _ in range(3):
        StateDB.open(path).close()
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 6
    finally:
        raw.close()


def _database_at_version(path: Path, version: int) -> sqlite3.Connection:
    """A state file as drawbridge wrote it at schema ``version``, open in autocommit mode."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    raw.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for migration in MIGRATIONS[:version]:
        for statement in migration.statements:
            raw.execute(statement)
        raw.execute("INSERT INTO schema_version VALUES (?, ?, '2026-01-01T00:00:00.000000Z')", (migration.version, migration.name))
    return raw


def test_a_version_2_database_gains_the_approver_and_the_memory_key(tmp_path: Path) -> None:
    """Migration 3 on a file written by version 2: existing approvals ask anyone, and memory keeps
    counting them under their shape digest."""
    path = tmp_path / "state.db"
    raw = _database_at_version(path, 2)
    raw.execute(
        "INSERT INTO approvals (id, agent, tool, args_digest, shape_digest, reason, status, created_at, expires_at) "
        "VALUES ('00000000000000aa', 'a', 't', 'hmac-sha256:k:00', 'sha256:' || hex(zeroblob(32)), 'r', 'pending', "
        "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:05:00.000000Z')"
    )
    raw.close()
    StateDB.open(path).close()
    raw = sqlite3.connect(path)
    try:
        row = raw.execute("SELECT approver, memory_digest = shape_digest FROM approvals").fetchone()
        assert row == ("any", 1)
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute("UPDATE approvals SET approver = 'client'")
    finally:
        raw.close()


def test_a_version_4_database_keeps_its_pins_and_gains_their_definitions(tmp_path: Path) -> None:
    """Migration 5 on a file written by version 4: a pin made then is read with no definition (its
    change shows by description alone), and new pins keep theirs."""
    path = tmp_path / "state.db"
    raw = _database_at_version(path, 4)
    at = "2026-01-01T00:00:00.000000Z"
    raw.execute("INSERT INTO pin_servers VALUES ('s', ?, 'cli:ana')", (at,))
    raw.execute("INSERT INTO pins VALUES ('s', 'old', 'sha256:' || lower(hex(zeroblob(32))), 'd', ?, 'cli:ana')", (at,))
    raw.close()
    db = StateDB.open(path)
    try:
        assert db.schema_version() == 6
        pins = anyio.run(SqlitePinStore(db).load, "s")
        assert pins["old"].description == "d" and pins["old"].definition is None
    finally:
        db.close()


def test_a_version_5_database_keeps_its_tool_pins_and_pins_prompts_apart(tmp_path: Path) -> None:
    """Migration 6 on a file written by version 5: every pin and observation becomes a tool's, and a
    prompt of the same name on the same server is pinned (first use, accept) beside it, never over it."""
    path = tmp_path / "state.db"
    raw = _database_at_version(path, 5)
    at = "2026-01-01T00:00:00.000000Z"
    zero = "'sha256:' || lower(hex(zeroblob(32)))"
    raw.execute("INSERT INTO pin_servers VALUES ('s', ?, 'cli:ana')", (at,))
    raw.execute(f"INSERT INTO pins VALUES ('s', 'greet', {zero}, 'd', ?, 'cli:ana', NULL)", (at,))
    raw.execute("INSERT INTO observed_servers VALUES ('s', ?)", (at,))
    raw.execute(f"INSERT INTO observed_tools VALUES ('s', 'greet', {zero}, 'd', ?, NULL)", (at,))
    raw.close()
    db = StateDB.open(path)
    try:
        assert db.schema_version() == 6
        tools, prompts = SqlitePinStore(db), SqlitePinStore(db, "prompt")
        text = '{"name":"greet"}'
        prompt = ToolDefinition(sha256_prefixed(text.encode()), "Say hello", text)
        when = datetime(2026, 1, 2, tzinfo=UTC)

        async def scenario() -> None:
            assert await tools.is_pinned("s") and not await prompts.is_pinned("s")
            assert (await tools.observed("s"))["greet"].description == "d"
            assert await prompts.trust_on_first_use("s", {"greet": prompt}, at=when)
            assert (await tools.load("s"))["greet"].description == "d"
            assert (await prompts.load("s"))["greet"].description == "Say hello"
            await prompts.observe("s", {}, at=when)
            [gone] = await prompts.accept("s", ["greet"], accepted_by="cli:ana", at=when)
            assert gone.record()["kind"] == "prompt" and gone.record()["prompt"] == "greet"
            assert gone.record()["removed"] and "tool" not in gone.record()
            assert await prompts.load("s") == {} and set(await tools.load("s")) == {"greet"}

        anyio.run(scenario)
        with pytest.raises(ValueError, match="kind"):
            SqlitePinStore(db, "resource")
    finally:
        db.close()


def test_garbage_file_is_refused_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StateUnavailable) as info:
        StateDB.open(path)
    assert str(path) in str(info.value)
    assert "not a drawbridge state database (not a SQLite file)" in str(info.value)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE customers (id INTEGER)")
    raw.commit()
    raw.close()
    with pytest.raises(StateUnavailable, match="not a drawbridge state database"):
        StateDB.open(path)
    raw = sqlite3.connect(path)  # and it was left alone
    try:
        tables = [r[0] for r in raw.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
        assert tables == ["customers"]
    finally:
        raw.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateDB.open(path).close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO schema_version VALUES (99, 'future', '2030-01-01T00:00:00.000000Z')")
    raw.commit()
    raw.close()
    newer = r"schema version 99, newer than this drawbridge supports \(6\)"
    with pytest.raises(StateUnavailable, match=newer):
        StateDB.open(path)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(StateUnavailable, match="does not exist"):
        StateDB.open(tmp_path / "nope" / "state.db")


def test_closed_database_refuses(tmp_path: Path) -> None:
    db = StateDB.open(tmp_path / "state.db")
    db.close()
    db.close()  # idempotent
    with pytest.raises(StateUnavailable, match="closed"):
        db.read_sync(lambda c: c.execute("SELECT 1").fetchone(), "probe")


def test_exception_in_a_write_rolls_back(tmp_path: Path) -> None:
    db = StateDB.open(tmp_path / "state.db")

    def half(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO pin_servers VALUES ('s', 'tool', 'x', 'y')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        db.write_sync(half, "half")
    assert db.read_sync(lambda c: c.execute("SELECT count(*) FROM pin_servers").fetchone()[0], "count") == 0
    db.close()


def test_quick_check_ok(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "state.db") as db:
        assert db.quick_check() == ["ok"]


def test_locked_past_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = StateDB.open(path, busy_timeout=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(StateUnavailable, match="locked"):
            db.write_sync(lambda c: c.execute("INSERT INTO pin_servers VALUES ('s', 'tool', 'x', 'y')"), "write")
        assert time.monotonic() - started >= 0.15
    finally:
        other.execute("ROLLBACK")
        other.close()
        db.close()


@pytest.mark.anyio
async def test_blocking_waits_happen_off_the_event_loop(tmp_path: Path) -> None:
    """A write that waits for another process's lock must not stall other tasks."""
    path = tmp_path / "state.db"
    db = await StateDB.open_async(path, busy_timeout=5.0)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.4, lambda: other.execute("COMMIT"))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            release.start()
            await db.write(lambda c: c.execute("INSERT INTO pin_servers VALUES ('s', 'tool', 'x', 'y')"), "write")
            tg.cancel_scope.cancel()
        assert ticks >= 10  # the loop kept running during the ~0.4 s wait
    finally:
        release.join()
        other.close()
        db.close()


def test_time_format_is_fixed_width_utc() -> None:
    at = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))
    assert to_db_time(at) == "2026-03-04T03:06:07.000000Z"
    assert from_db_time("2026-03-04T03:06:07.000000Z") == at
    with pytest.raises(ValueError, match="timezone-aware"):
        to_db_time(datetime(2026, 1, 1))
    for bad in ("2026-03-04T03:06:07Z", "2026-03-04 03:06:07.000000Z", 5, None):
        with pytest.raises(ValueError):
            from_db_time(bad)


@given(
    st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)),
)
def test_stored_time_text_orders_like_time(a: datetime, b: datetime) -> None:
    """The stores compare timestamps as text in SQL; that is only right if text order is time order."""
    ta, tb = to_db_time(a), to_db_time(b)
    assert (ta < tb) == (a < b) and (ta == tb) == (a == b)
    assert from_db_time(ta) == a
