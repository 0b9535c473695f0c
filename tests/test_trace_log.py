"""The append-only trace writer: durability settings, recovery, refusal of corrupt logs, concurrency."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from drawbridge.evidence.chain import GENESIS_HASH, ChainFormatError, ChainHead, split_lines, verify_chain
from drawbridge.state import trace_log as trace_log_module
from drawbridge.state.trace_log import TraceLog, TraceLogCorrupt, TraceLogError, TraceLogLocked

AT = "2026-03-01T12:00:00Z"


def independent_hash(entry: dict[str, Any]) -> str:
    without = {k: v for k, v in entry.items() if k != "entry_hash"}
    text = json.dumps(without, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def read_entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_new_log_is_created_0600_and_chains(tmp_path: Path) -> None:
    path = tmp_path / "trace.ndjson"
    with TraceLog(path) as log:
        assert log.head is None
        first = log.append("tool_decision", AT, {"tool": "a", "action": "allow"})
        second = log.append("policy_edit", AT, {"tool": "b"})
        assert log.head == ChainHead(seq=1, entry_hash=second["entry_hash"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    entries = read_entries(path)
    assert entries == [first, second]
    assert entries[0]["prev_hash"] == GENESIS_HASH
    assert entries[1]["prev_hash"] == entries[0]["entry_hash"]
    for entry in entries:
        assert entry["entry_hash"] == independent_hash(entry)
    assert path.read_bytes().endswith(b"\n")
    assert verify_chain(split_lines(path.read_bytes())).ok


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "trace.ndjson"
    with TraceLog(path) as log:
        for i in range(3):
            log.append("tool_decision", AT, {"i": i})
        head = log.head
    with TraceLog(path, fsync="never") as log:
        assert log.head == head
        entry = log.append("tool_decision", AT, {"i": 3})
    assert head is not None
    assert entry["seq"] == head.seq + 1
    assert entry["prev_hash"] == head.entry_hash
    report = verify_chain(split_lines(path.read_bytes()))
    assert report.ok and report.entries == 4


def test_appends_are_single_writes_in_append_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.ndjson"
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    with TraceLog(path) as log:
        monkeypatch.setattr(trace_log_module.os, "write", spy)
        log.append("tool_decision", AT, {"x": 1})
        log.append("tool_decision", AT, {"x": 2})
        flags = fcntl.fcntl(log._fd, fcntl.F_GETFL)
    assert flags & os.O_APPEND
    assert len(writes) == 2
    assert b"".join(writes) == path.read_bytes()
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)


@pytest.mark.parametrize(
    ("policy", "batch_size", "appends", "expected_fsyncs_during_appends"),
    [("always", 64, 5, 5), ("batch", 2, 5, 2), ("never", 64, 5, 0)],
)
def test_fsync_policy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
    batch_size: int,
    appends: int,
    expected_fsyncs_during_appends: int,
) -> None:
    calls: list[int] = []
    real_fsync = os.fsync
    log = TraceLog(tmp_path / "t.ndjson", fsync=policy, batch_size=batch_size)  # type: ignore[arg-type]
    monkeypatch.setattr(trace_log_module.os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    for i in range(appends):
        log.append("tool_decision", AT, {"i": i})
    assert len(calls) == expected_fsyncs_during_appends
    log.close()
    # batch syncs the remainder on close; never never syncs
    assert len(calls) == expected_fsyncs_during_appends + (1 if policy == "batch" else 0)


def test_always_syncs_before_returning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.ndjson"
    seen_on_fsync: list[int] = []
    with TraceLog(path) as log:
        monkeypatch.setattr(trace_log_module.os, "fsync", lambda fd: seen_on_fsync.append(path.stat().st_size))
        log.append("tool_decision", AT, {})
        size_after = path.stat().st_size
    assert seen_on_fsync and seen_on_fsync[0] == size_after


def test_batch_sync_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    with TraceLog(tmp_path / "t.ndjson", fsync="batch", batch_size=100) as log:
        monkeypatch.setattr(trace_log_module.os, "fsync", lambda fd: calls.append(fd))
        log.append("k", AT, {})
        assert calls == []
        log.sync()
        assert len(calls) == 1
        log.sync()  # nothing new to sync
        assert len(calls) == 1


def test_invalid_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        TraceLog(tmp_path / "t.ndjson", fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TraceLog(tmp_path / "t.ndjson", fsync="batch", batch_size=0)


def test_bad_entry_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    with TraceLog(path) as log:
        log.append("k", AT, {})
        size = path.stat().st_size
        with pytest.raises(ChainFormatError):
            log.append("Bad Kind", AT, {})
        with pytest.raises(ChainFormatError):
            log.append("k", "not a time", {})
        assert path.stat().st_size == size
        assert log.append("k", AT, {})["seq"] == 1


def _write_log(path: Path, n: int = 4) -> list[bytes]:
    with TraceLog(path, fsync="never") as log:
        for i in range(n):
            log.append("tool_decision", AT, {"i": i})
    return split_lines(path.read_bytes())


@pytest.mark.parametrize(
    ("damage", "code", "line"),
    [
        (lambda lines: lines[:1] + lines[2:], "seq_gap", 2),
        (lambda lines: [lines[0].replace(b'"i":0', b'"i":9')] + lines[1:], "hash_mismatch", 1),
        (lambda lines: lines[:-1] + [lines[-1][:30]], "trailing_partial_line", 4),
        (lambda lines: lines + [b"garbage\n"], "malformed_json", 5),
    ],
)
def test_corrupt_existing_log_refuses_to_open_and_is_untouched(
    tmp_path: Path, damage: Any, code: str, line: int
) -> None:
    path = tmp_path / "t.ndjson"
    damaged = b"".join(damage(_write_log(path)))
    path.write_bytes(damaged)
    with pytest.raises(TraceLogCorrupt) as info:
        TraceLog(path)
    message = str(info.value)
    assert code in message and f"line {line}" in message and str(path) in message
    assert path.read_bytes() == damaged


def test_cut_log_refuses_to_open_against_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    lines = _write_log(path)
    head = ChainHead(seq=3, entry_hash=json.loads(lines[-1])["entry_hash"])
    path.write_bytes(b"".join(lines[:2]))
    with pytest.raises(TraceLogCorrupt, match="truncated"):
        TraceLog(path, expected_head=head)


def test_reopen_with_matching_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    lines = _write_log(path)
    head = ChainHead(seq=3, entry_hash=json.loads(lines[-1])["entry_hash"])
    with TraceLog(path, expected_head=head) as log:
        assert log.head == head


def test_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    with TraceLog(path):
        with pytest.raises(TraceLogLocked):
            TraceLog(path)
    with TraceLog(path) as again:  # released on close
        assert again.head is None


def test_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceLogError, match="not a regular file"):
        TraceLog(tmp_path)


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = TraceLog(tmp_path / "t.ndjson")
    log.close()
    log.close()
    with pytest.raises(TraceLogError, match="closed"):
        log.append("k", AT, {})


def test_short_write_poisons_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.ndjson"
    real_write = os.write
    with TraceLog(path) as log:
        log.append("k", AT, {})
        monkeypatch.setattr(trace_log_module.os, "write", lambda fd, data: real_write(fd, data[:10]))
        with pytest.raises(TraceLogError, match="short write"):
            log.append("k", AT, {})
        monkeypatch.setattr(trace_log_module.os, "write", real_write)
        with pytest.raises(TraceLogError, match="unusable"):
            log.append("k", AT, {})
    with pytest.raises(TraceLogCorrupt, match="trailing_partial_line"):
        TraceLog(path)


def test_failed_fsync_poisons_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with TraceLog(tmp_path / "t.ndjson") as log:
        monkeypatch.setattr(trace_log_module.os, "fsync", failing)
        with pytest.raises(TraceLogError, match="fsync failed"):
            log.append("k", AT, {})
        with pytest.raises(TraceLogError, match="unusable"):
            log.append("k", AT, {})


def test_threads_form_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    with TraceLog(path, fsync="never") as log:

        def work(t: int) -> None:
            for i in range(50):
                log.append("tool_decision", AT, {"t": t, "i": i})

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report = verify_chain(split_lines(path.read_bytes()))
    assert report.ok and report.entries == 400
    bodies = {(e["body"]["t"], e["body"]["i"]) for e in read_entries(path)}
    assert len(bodies) == 400


def test_async_append(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"

    async def main() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with TraceLog(path) as log:

            async def one(i: int) -> None:
                out.append(await log.append_async("tool_decision", AT, {"i": i}))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        return out

    entries = anyio.run(main)
    assert sorted(e["seq"] for e in entries) == list(range(20))
    report = verify_chain(split_lines(path.read_bytes()))
    assert report.ok and report.entries == 20
