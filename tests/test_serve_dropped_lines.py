"""``drawbridge serve --stdio`` in front of a stdio upstream whose lines must be dropped: an answer too
large to read, an answer for an id nobody is waiting on. Each is recorded in the trace, naming the
upstream and never the line's content; an answer dropped for its size whose start proves which call
it answers ends that call at once (-32603), as under wrap (test_wrap_dropped_answers.py), and a
flood of stray answers is recorded whole but logged only in part.

The real gateway and a real upstream (tests/fixtures/servers/scripted.py) run as processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from approval_support import decisions, trace
from conftest import PYTHON, SERVERS, raw_pipe, scaled
from serve_support import serve_argv, write_config

from drawbridge.gateway.protocol.jsonrpc import DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES
from drawbridge.gateway.upstreams.dropped_lines import LOG_BURST

pytestmark = pytest.mark.anyio

SCRIPTED = {"name": "scripted", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "scripted.py")]}
HUGE = DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES + 4096
"""A line past serve's limit on what an upstream sends (64 MiB): the reviewer's 67 MB answer."""


def _config(tmp_path: Path, call_timeout: float) -> Path:
    return write_config(tmp_path, [SCRIPTED], fsync="never", limits={"call_timeout_seconds": call_timeout})


def _incidents(evidence: Path, kind: str) -> list[dict[str, Any]]:
    return [e["body"] for e in trace(evidence, "relay_incident") if e["body"]["kind"] == kind]


async def test_an_answer_too_large_is_recorded_and_answers_its_call_at_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, call_timeout=600)  # an answer that waited for the timeout would fail the test
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        await pipe.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                         "params": {"name": "scripted.huge", "arguments": {"bytes": HUGE}}})
        answer = json.loads(await pipe.response_line(5, timeout=scaled(60)))
        after = await pipe.request(6, "tools/call", {"name": "scripted.echo", "arguments": {"n": 6}})
    assert after["result"]["content"][0]["text"] == '{"n": 6}'  # the upstream goes on being served
    error = answer["error"]
    assert error["code"] == -32603, error
    assert "could not be passed on" in error["message"] and "upstream 'scripted'" in error["message"], error
    assert f"exceeds the limit of {DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES} bytes" in error["message"], error
    evidence = tmp_path / "evidence"
    [incident] = _incidents(evidence, "upstream_oversize")
    assert incident["direction"] == "upstream" and "upstream 'scripted'" in incident["detail"], incident
    assert "AAAA" not in incident["detail"]
    [record] = [r for r in decisions(evidence, "scripted.huge") if r["request_id"] == "5"]
    assert record["outcome"] == "upstream_error" and "exceeds the limit" in record["error"], record
    logged = capfd.readouterr().err
    assert "upstream_oversize" in logged and "upstream 'scripted'" in logged, logged


async def test_an_answer_not_utf8_is_recorded_and_answers_its_call_at_once(tmp_path: Path) -> None:
    config = _config(tmp_path, call_timeout=600)
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        answer = await pipe.request(12, "tools/call", {"name": "scripted.bad_utf8", "arguments": {}})
    error = answer["error"]
    assert error["code"] == -32603 and "a line from upstream 'scripted' was dropped: parse error" in error["message"], error
    [incident] = _incidents(tmp_path / "evidence", "upstream_garbage")
    assert "upstream 'scripted'" in incident["detail"] and "bad " not in incident["detail"], incident


async def test_an_answer_too_large_that_names_no_call_first_is_reported_and_its_call_times_out(tmp_path: Path) -> None:
    """Its id comes after the part read: nothing proves whose answer it was, so no call is guessed."""
    config = _config(tmp_path, call_timeout=2)
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        answer = await pipe.request(7, "tools/call", {"name": "scripted.huge", "arguments": {"bytes": HUGE, "id_last": True}})
    assert answer["error"]["code"] == -32001, answer
    assert len(_incidents(tmp_path / "evidence", "upstream_oversize")) == 1


async def test_answers_for_no_call_in_flight_are_recorded(tmp_path: Path) -> None:
    config = _config(tmp_path, call_timeout=60)
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        twice = await pipe.request(8, "tools/call", {"name": "scripted.twice", "arguments": {}})
        stray = await pipe.request(9, "tools/call", {"name": "scripted.wrong_id", "arguments": {}})
        ping = await pipe.request(10, "ping")  # answered after both stray lines were read
    assert twice["result"]["content"][0]["text"] == "first" and stray["result"]["content"][0]["text"] == "right"
    assert ping["result"] == {}
    details = [incident["detail"] for incident in _incidents(tmp_path / "evidence", "unknown_response")]
    assert len(details) == 2, details
    second, nobody = details
    assert "upstream 'scripted'" in second and "is no longer in flight (answered already, or given up)" in second
    assert "'nobody-asked'" in nobody and "which the gateway never sent" in nobody
    assert not any("second" in detail or "stray" in detail for detail in details)  # never the content


async def test_a_flood_of_stray_answers_is_recorded_whole_and_logged_in_part(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, call_timeout=60)
    async with raw_pipe(serve_argv(config, "--stdio")) as pipe:
        await pipe.initialize()
        answer = await pipe.request(11, "tools/call", {"name": "scripted.strays", "arguments": {"n": 40}})
    assert answer["result"]["content"][0]["text"] == "after the strays"
    assert len(_incidents(tmp_path / "evidence", "unknown_response")) == 40
    logged = [line for line in capfd.readouterr().err.splitlines() if "unknown_response" in line]
    assert len(logged) == LOG_BURST, logged
