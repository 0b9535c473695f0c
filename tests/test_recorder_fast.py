"""The evidence recorder's fast paths write the same bytes and keep the durability promise.

``record_now`` (the synchronous form the relay uses, for several records at once), the surface-line
cache and the fsyncs done off the event loop must not change a byte of evidence: the same records
through every route and fsync setting give identical files, and each cached surface line equals the
line built from scratch. Under ``fsync="always"`` records complete only after one fsync per file
they were written to, shared by the records written together; under ``"batch"`` a file with unsynced lines is fsynced within the time bound without further
records, and at once, in the background, when it holds ``BATCH_LINES`` of them; the record that takes a
file to the limit of unsynced lines is complete only when that file has been fsynced; a failed fsync
fails every later record.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import rfc8785
from conftest import eventually, scaled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drawbridge.canonical import CanonicalizationError, canonical_bytes
from drawbridge.evidence.surface import build_decision, build_surface
from drawbridge.evidence.truth.carrier import CarrierError
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayIncident
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.pipeline.verdicts import Action, Provenance
from drawbridge.gateway.recording import clock as clock_module
from drawbridge.gateway.recording import recorder as recorder_module
from drawbridge.gateway.recording.durability import BATCH_LINES
from drawbridge.gateway.recording.recorder import EvidenceRecorder, TruthKey, effect_status
from drawbridge.gateway.recording.segments import ndjson_line
from drawbridge.state.append_only import AppendOnlyError

LIMIT = 64
"""The unsynced lines at which "batch" records wait for an fsync, in the recorders of these tests
(the default is larger; the behaviour is the same at any value)."""
CONTRACT = {"version": "2.0", "tools": {"allow": ["echo", "add_deploy_key"], "deny": ["rm*"]}, "schemas": {}}
TRACEPARENT = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def _record(i: int) -> CallRecord:
    """A mix: unknown and classified tools, with and without _meta, every kind of outcome."""
    tool = ["echo", "add_deploy_key", "rm_rf", "echo", "ns.invite"][i % 5]
    outcome = [Outcome.OK, Outcome.OK, Outcome.REFUSED, Outcome.TIMEOUT, Outcome.TOOL_ERROR][i % 5]
    action = Action.DENY if outcome is Outcome.REFUSED else Action.ALLOW
    args = {"text": f"hi {i}", "owner": "acme", "repo": f"r{i % 3}", "user": "u1", "channel_id": "C1", "n": i * 0.5}
    meta = TRACEPARENT if i % 4 == 1 else None
    call = ToolCall("agent-1", tool, args, meta, i)
    return CallRecord(
        agent="agent-1", request_id=i, tool=tool, action=action, reason=f"{action} by rule {i % 2}",
        provenance=Provenance("demo", "/p/demo.yaml", i % 2), outcome=outcome, error=None, error_code=None,
        decision_ms=0.25, latency_ms=1.0 + i, protocol_version="2025-11-25", call=call, tool_listed=i % 2 == 0,
    )


def _recorder(directory: Path, fsync: str) -> EvidenceRecorder:
    return EvidenceRecorder(
        directory / "ev", route=lambda tool: "srv", truth_out=directory / "carriers.ndjson",
        truth_key=TruthKey(b"k" * 32, "kid-1"), declared=lambda agent: CONTRACT,
        fsync=fsync,  # type: ignore[arg-type]
        clock=lambda: "2026-01-01T00:00:00.000000Z",
        batch_seconds=60,  # the time bound stays out of the way of the counts tested here
        batch_limit=LIMIT,
        batch_lines=LIMIT,  # and so do the background fsyncs
    )


def _files(directory: Path) -> tuple[bytes, bytes, bytes]:
    return (
        (directory / "ev" / "trace.ndjson").read_bytes(),
        (directory / "ev" / "tool-decisions.ndjson").read_bytes(),
        (directory / "carriers.ndjson").read_bytes(),
    )


def _events(count: int) -> list[Any]:
    events: list[Any] = []
    for i in range(count):
        events.append(_record(i))
        if i % 17 == 0:
            events.append(RelayIncident("parse_error", "client", f"line {i} is not JSON", -32700))
    return events


def test_every_route_and_setting_writes_the_same_bytes(tmp_path: Path) -> None:
    events = _events(150)
    outputs = []
    for fsync in ("always", "batch", "never"):
        for route in ("await", "record_now", "record_now in batches"):
            directory = tmp_path / f"{fsync}-{route}"
            recorder = _recorder(directory, fsync)

            async def run() -> None:
                if route == "await" or recorder.record_now is None:
                    for event in events:
                        await recorder(event)
                    return
                size = 1 if route == "record_now" else 7  # batches that straddle the fsyncs at the limit
                for start in range(0, len(events), size):
                    rest = recorder.record_now(events[start : start + size])
                    if rest is not None:
                        await rest

            anyio.run(run)
            recorder.close()
            outputs.append(_files(directory))
    assert all(output == outputs[0] for output in outputs[1:])
    assert outputs[0][0].count(b"\n") == len(events)


_ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)  # control characters, lone surrogates
_NUMBER = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.0, 0.001, 1e-7, 2.0**53, 2.0**60, 123456.7895]),
)
_INTEGER = st.one_of(st.integers(-(2**60), 2**60), st.sampled_from([2**53 - 1, 2**53, -(2**53)]))


@st.composite
def _call_records(draw: st.DrawFn) -> CallRecord:
    provenance = draw(st.one_of(st.none(), st.builds(
        Provenance, st.one_of(st.none(), _ANY_TEXT), st.one_of(st.none(), _ANY_TEXT), st.one_of(st.none(), _INTEGER),
    )))
    return CallRecord(
        agent=draw(_ANY_TEXT), request_id=draw(st.one_of(_INTEGER, st.text(max_size=200))),
        tool=draw(st.one_of(st.none(), _ANY_TEXT)), action=draw(st.one_of(st.none(), st.sampled_from(Action))),
        reason=draw(st.one_of(st.none(), _ANY_TEXT)), provenance=provenance, outcome=draw(st.sampled_from(Outcome)),
        error=draw(st.one_of(st.none(), _ANY_TEXT)), error_code=draw(st.one_of(st.none(), _INTEGER)),
        decision_ms=draw(st.one_of(st.none(), _NUMBER)), latency_ms=draw(_NUMBER),
        protocol_version=draw(st.one_of(st.none(), st.sampled_from(["2025-11-25", "2026-07-28"]))),
        approval=draw(st.one_of(st.none(), st.just({"state": "approved", "channel": "elicitation"}))),
    )


EVIDENCE = [
    {"content_hash": "sha256:" + "ab" * 32, "type": "assay.tool_decision_surface.v0"},
    {"content_hash": "sha256:" + "cd" * 32, "type": "assay.tool_decision_truth.v0"},
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_call_records(), min_size=1, max_size=3), digest=st.one_of(st.none(), _ANY_TEXT))
def test_the_trace_body_rendered_from_cached_segments_is_its_canonical_json(
    tmp_path: Path, records: list[CallRecord], digest: str | None
) -> None:
    recorder = _recorder(tmp_path / str(len(list(tmp_path.iterdir()))), "never")
    try:
        for record in records:
            # The same fields again, with the ones that change per call changed: the cached segments.
            again = dataclasses.replace(record, request_id=7, latency_ms=record.latency_ms + 1.5, decision_ms=None)
            for each, evidence in ((record, EVIDENCE), (again, []), (record, EVIDENCE[:1])):
                try:
                    expected: bytes | None = canonical_bytes(EvidenceRecorder._trace_body(each, digest, evidence))
                except CanonicalizationError:
                    expected = None
                if expected is None:
                    with pytest.raises(CanonicalizationError):
                        recorder._trace_body_bytes(each, digest, evidence)
                else:
                    assert recorder._trace_body_bytes(each, digest, evidence) == expected
                    # Without an approval the short route serves it, from segments now cached.
                    assert each.approval is not None or recorder._body_segments
    finally:
        recorder.close()


@st.composite
def _decided_calls(draw: st.DrawFn) -> CallRecord:
    tool = draw(st.sampled_from(["echo", "add_deploy_key", "rm_rf", "ns.invite", "\u00e9cho", "t\U0001F600"]))
    arguments: dict[str, Any] = draw(st.dictionaries(_ANY_TEXT, st.one_of(_ANY_TEXT, _INTEGER, _NUMBER), max_size=3))
    call_id = draw(st.one_of(st.none(), _ANY_TEXT))
    if call_id is not None:
        arguments["_meta"] = {"tool_call_id": call_id}
    request_id = draw(st.one_of(_INTEGER, _ANY_TEXT))
    return CallRecord(
        agent="agent-1", request_id=request_id, tool=tool, action=Action.ALLOW, reason="allowed",
        provenance=Provenance("demo", "/p/demo.yaml", 0), outcome=Outcome.OK, error=None, error_code=None,
        decision_ms=0.1, latency_ms=1.0, protocol_version="2025-11-25",
        call=ToolCall("agent-1", tool, arguments, None, request_id), tool_listed=draw(st.booleans()),
        approval=draw(st.one_of(st.none(), st.just({"state": "approved", "channel": "elicitation"}))),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_decided_calls(), min_size=1, max_size=6))
def test_the_carrier_line_rendered_from_cached_segments_is_the_minted_carriers_line(
    tmp_path: Path, records: list[CallRecord]
) -> None:
    base = tmp_path / str(len(list(tmp_path.iterdir())))
    fast, reference = _recorder(base / "fast", "never"), _recorder(base / "reference", "never")
    try:
        for record in [*records, *records]:  # the second time round, every key is cached
            try:
                carrier = reference._carrier(record)
            except CarrierError:
                with pytest.raises(CarrierError):
                    fast._carrier_line(record)
                continue
            try:  # the content hash a bundle event of it would carry (None: no canonical form)
                hashed: str | None = "sha256:" + hashlib.sha256(
                    b'{"data":' + rfc8785.dumps(carrier) + b',"datacontenttype":"application/json",'
                    b'"specversion":"1.0","type":"assay.tool_decision_truth.v0"}').hexdigest()
            except (rfc8785.CanonicalizationError, UnicodeEncodeError):
                hashed = None
            assert fast._carrier_line(record) == (ndjson_line(carrier), carrier["args_digest"], hashed)
            try:
                json.dumps(carrier, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: the line is escaped to ASCII, the long route
                continue
            # A line written in UTF-8 is one the segments serve: the short route was taken.
            key = (carrier["tool_name"], carrier["identity_state"], carrier["decision_verdict"],
                   carrier["declared_policy_digest"], carrier["key_id"])
            assert key in fast._carrier_segments
    finally:
        fast.close()
        reference.close()


def test_each_cached_surface_line_equals_one_built_from_scratch(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, "never")
    for i in range(40):
        record = _record(i)
        effect, status = effect_status(record.outcome)
        provenance = record.provenance
        assert provenance is not None
        rule_id = f"{provenance.policy}#{provenance.rule_index}"
        assert record.call is not None
        expected = ndjson_line(build_surface([build_decision(
            server_id="srv", tool_name=record.tool or "", arguments=record.call.arguments,
            params={"_meta": dict(record.call.meta)} if record.call.meta else {},
            effect=effect, status=status, rule_id=rule_id,
        )]))
        assert recorder._call_lines(record)[2] == expected
        document = json.loads(expected)
        hashed = "sha256:" + hashlib.sha256(
            b'{"data":' + rfc8785.dumps(document) + b',"datacontenttype":"application/json",'
            b'"specversion":"1.0","type":"assay.tool_decision_surface.v0"}').hexdigest()
        body = recorder._call_lines(record)[1]
        named = json.loads(bytes(body))["evidence"]  # the surface record, then the truth carrier
        assert named[0] == {"content_hash": hashed, "type": "assay.tool_decision_surface.v0"}
        assert [item["type"] for item in named[1:]] == ["assay.tool_decision_truth.v0"]
    assert recorder._surface_cache  # the unknown tools without _meta were cached
    recorder.close()


def _spy_fsync(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(recorder_module.os, "fsync", spy)
    return synced


def _spied_recorder(
    tmp_path: Path, fsync: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[EvidenceRecorder, list[int], list[int]]:
    """A recorder, the list its fsyncs go to (emptied of those made when the files were created:
    each file and its directory) and its three sync descriptors."""
    synced = _spy_fsync(monkeypatch)
    recorder = _recorder(tmp_path, fsync)
    sync_fds = list(recorder._sync_fds)
    assert len(sync_fds) == 3
    synced.clear()
    return recorder, synced, sync_fds


def test_always_completes_records_only_after_one_shared_fsync_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, synced, sync_fds = _spied_recorder(tmp_path, "always", monkeypatch)

    async def run() -> None:
        rest = recorder.record_now([_record(i) for i in range(5)])
        assert rest is not None and synced == []  # written, not yet complete
        await rest
        assert sorted(synced) == sorted(sync_fds)  # one fsync per file for the five records
        synced.clear()
        await recorder(RelayIncident("parse_error", "client", "x", None))  # a trace line only
        assert synced == [sync_fds[0]]

    anyio.run(run)
    recorder.close()


def _batch_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_seconds: float
) -> tuple[EvidenceRecorder, list[int], list[int]]:
    """A "batch" recorder with the default line counts, its fsyncs spied on (from now on) and its
    sync descriptors."""
    synced = _spy_fsync(monkeypatch)
    recorder = EvidenceRecorder(
        tmp_path / "ev", route=lambda tool: "srv", truth_out=tmp_path / "carriers.ndjson",
        truth_key=TruthKey(b"k" * 32, "kid-1"), declared=lambda agent: CONTRACT, fsync="batch",
        batch_seconds=batch_seconds,
    )
    synced.clear()
    return recorder, synced, list(recorder._sync_fds)


def test_batch_fsyncs_a_file_within_its_time_bound_without_further_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, synced, sync_fds = _batch_recorder(tmp_path, monkeypatch, batch_seconds=0.2)
    try:
        assert recorder.record_now([_record(0)]) is None  # complete at once: in the kernel
        eventually(lambda: sorted(set(synced)) == sorted(sync_fds), scaled(5), "the timed fsyncs")
        assert recorder._unsynced == [0, 0, 0]
        synced.clear()
        time.sleep(scaled(0.5))  # more than two time bounds
        assert synced == []  # nothing unsynced, nothing to do
    finally:
        recorder.close()
    assert recorder._syncer is None


def test_batch_fsyncs_a_file_at_once_in_the_background_when_it_holds_batch_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the line count can start these fsyncs: the time bound is a minute.
    recorder, synced, sync_fds = _batch_recorder(tmp_path, monkeypatch, batch_seconds=60)
    try:
        assert recorder.record_now([_record(i) for i in range(BATCH_LINES - 1)]) is None
        time.sleep(scaled(0.3))
        assert synced == []  # below the count, the time bound (a minute here) rules
        started = time.monotonic()
        assert recorder.record_now([_record(BATCH_LINES - 1)]) is None  # nobody waits for it
        eventually(lambda: sorted(set(synced)) == sorted(sync_fds), scaled(5), "the fsyncs the line count starts")
        assert time.monotonic() - started < scaled(5)  # long before the minute
        # The fsyncs may start between the last record's trace line and its other lines, which
        # then wait for the next one.
        assert all(count <= 1 for count in recorder._unsynced)
    finally:
        recorder.close()


def test_a_failed_timed_fsync_fails_every_later_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = EvidenceRecorder(
        tmp_path / "ev", route=lambda tool: "srv", fsync="batch", batch_seconds=0.1,
    )

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(recorder_module.os, "fsync", broken)
    try:
        assert recorder.record_now([_record(0)]) is None
        eventually(lambda: recorder._broken is not None, scaled(5), "the failed fsync noticed")
        with pytest.raises(AppendOnlyError, match="fsync failed: Input/output error"):
            recorder.record_now([_record(1)])
    finally:
        monkeypatch.undo()
        recorder.close()
    assert (tmp_path / "ev" / "trace.ndjson").read_bytes().count(b"\n") == 1


def test_batch_records_that_reach_the_limit_complete_only_with_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, synced, sync_fds = _spied_recorder(tmp_path, "batch", monkeypatch)

    async def run() -> None:
        for i in range(LIMIT - 1):
            assert recorder.record_now([_record(i)]) is None  # written, nothing to wait for
        assert synced == []
        rest = recorder.record_now([_record(LIMIT - 1)])  # each file's line at the limit
        assert rest is not None
        assert synced == []  # not yet: the record completes with the fsync
        await rest
        assert sorted(synced) == sorted(sync_fds)
        # An incident adds a trace line only: the trace is the first file due again.
        synced.clear()
        for i in range(LIMIT - 1):
            assert recorder.record_now([RelayIncident("parse_error", "client", "x", None)]) is None
        rest = recorder.record_now([RelayIncident("parse_error", "client", "x", None)])
        assert rest is not None
        await rest
        assert synced == [sync_fds[0]]

    anyio.run(run)
    synced.clear()
    recorder.close()
    assert len(synced) >= 3  # closing syncs what each file still holds unsynced


def test_records_written_together_take_one_write_per_file_and_are_synced_if_they_cross_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    real_write = os.write

    def write_spy(fd: int, data: bytes) -> int:
        writes.append(data.count(b"\n"))
        return real_write(fd, data)

    recorder = _recorder(tmp_path, "batch")
    sync_fds = list(recorder._sync_fds)
    monkeypatch.setattr("drawbridge.state.append_only.os.write", write_spy)
    synced = _spy_fsync(monkeypatch)

    async def run() -> None:
        assert recorder.record_now([_record(i) for i in range(LIMIT - 5)]) is None
        assert writes == [LIMIT - 5] * 3  # trace, surface, carriers: one write each
        assert synced == []
        writes.clear()
        rest = recorder.record_now([_record(i) for i in range(10)])  # crosses each file's limit
        assert writes == [10] * 3
        assert rest is not None and synced == []  # complete only with the fsync
        await rest
        assert sorted(synced) == sorted(sync_fds)

    anyio.run(run)
    recorder.close()
    trace = (tmp_path / "ev" / "trace.ndjson").read_bytes()
    assert trace.count(b"\n") == LIMIT + 5


def test_a_failed_batch_fsync_fails_that_record_and_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _recorder(tmp_path, "batch")

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def run() -> None:
        for i in range(LIMIT - 1):
            assert recorder.record_now([_record(i)]) is None
        rest = recorder.record_now([_record(LIMIT - 1)])
        assert rest is not None
        monkeypatch.setattr(recorder_module.os, "fsync", broken)
        with pytest.raises(AppendOnlyError, match="fsync failed: Input/output error"):
            await rest
        monkeypatch.undo()
        with pytest.raises(AppendOnlyError, match="no further records will be written"):
            recorder.record_now([_record(LIMIT)])
        with pytest.raises(AppendOnlyError):
            await recorder(_record(LIMIT + 1))
        with pytest.raises(AppendOnlyError):
            await recorder.record_event("policy_edit", {"x": 1})

    anyio.run(run)
    recorder.close()
    trace = (tmp_path / "ev" / "trace.ndjson").read_bytes()
    assert trace.count(b"\n") == LIMIT  # nothing after the failure


def test_the_guard_keeps_the_synchronous_form_and_the_recent_calls_see_each_call(tmp_path: Path) -> None:
    from drawbridge.control.services import RecentCallRing
    from drawbridge.gateway.pipeline.guard import EvidenceGuard
    from drawbridge.gateway.runtime.assembly import recent_call_summary

    recorder = _recorder(tmp_path, "never")
    ring = RecentCallRing()
    guard = EvidenceGuard(recorder)
    guard.observers.append(lambda record: recent_call_summary(record, ring))
    assert guard.record_now([_record(0), RelayIncident("parse_error", "client", "x", None), _record(2)]) is None
    recorder.close()
    assert _files(tmp_path)[0].count(b"\n") == 3  # one write, through the recorder's synchronous form
    recent = anyio.run(ring, "agent-1", 10)
    assert sorted(call["tool"] for call in recent) == ["echo", "rm_rf"]
    assert not guard.failed

    seen: list[Any] = []

    async def awaitable_only(event: Any) -> None:
        seen.append(event)

    only = EvidenceGuard(awaitable_only)  # type: ignore[arg-type]
    rest = only.record_now([_record(0)])
    assert rest is not None and seen == []  # recorded when awaited, before the answer
    anyio.run(lambda: rest)
    assert len(seen) == 1 and not only.failed


def test_utc_now_is_the_utc_time_to_the_microsecond_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime, timedelta

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    instants = (1_700_000_000_123_456_789, 1_700_000_000_999_999_999, 1_700_000_001_000_000_000, 0, 86_399_000_001_000)
    for ns in instants:
        monkeypatch.setattr(clock_module.time, "time_ns", lambda ns=ns: ns)
        expected = (epoch + timedelta(microseconds=ns // 1000)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert recorder_module.utc_now() == expected
