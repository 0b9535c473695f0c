"""What the gateway reads on the wire is what every reader reads: a disguised method, a number that
reads as 0, a server's line that reads two ways, and a request the session's state refuses never pass
as something else. ``wrap`` (and, where both commands are compared, ``serve --stdio``) runs as a
subprocess in front of fixtures/servers/recording.py, which writes down every line it receives, so
"never reached the server" is read from the server's side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from approval_support import decisions, trace
from conftest import PYTHON, SERVERS, raw_pipe, wrap_argv

pytestmark = pytest.mark.anyio

RECORDING = [PYTHON, str(SERVERS / "recording.py")]
POLICY = ('name: wire\nagent: "*"\nrules:\n  - tools: ["delete_all", "fx.delete_all"]\n    action: deny\n'
          '  - tools: ["*"]\n    action: allow\n')
MODES = ("wrap", "serve")
MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientCapabilities": {}}
DISGUISED = ["tools/call\u0000", "tools/call\u200b", "\uff54ools/call"]
"""Read as tools/call by a C-string reader (cut at NUL), by one that drops format characters, by one
that reads compatibility forms (NFKC)."""


def _argv(tmp_path: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    argv = wrap_argv(RECORDING, "--policy", str(tmp_path / "policy.yaml"),
                     "--evidence-dir", str(tmp_path / "evidence"), "--fsync", "never", *extra)
    return argv, {"RECORDING_LOG": str(tmp_path / "received.ndjson"), "RECORDING_RAW_TOOLS": "1"}


def _gateway(tmp_path: Path, mode: str, call_timeout: int) -> tuple[list[str], dict[str, str], str]:
    """The command line of ``mode`` in front of the recording server, its environment, and the prefix
    of the server's tool names."""
    if mode == "wrap":
        return (*_argv(tmp_path, "--call-timeout", str(call_timeout)), "")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "wire.yaml").write_text(POLICY, encoding="utf-8")
    env = {"RECORDING_LOG": str(tmp_path / "received.ndjson"), "RECORDING_RAW_TOOLS": "1"}
    upstream = {"name": "fx", "transport": "stdio", "command": RECORDING[0], "args": RECORDING[1:], "env": env}
    config = {"upstreams": [upstream], "policy_dir": str(tmp_path / "policies"),
              "evidence_dir": str(tmp_path / "evidence"), "state_path": str(tmp_path / "state.db"),
              "limits": {"call_timeout_seconds": call_timeout}}
    (tmp_path / "drawbridge.json").write_text(json.dumps(config), encoding="utf-8")
    argv = [PYTHON, "-m", "drawbridge", "serve", "--config", str(tmp_path / "drawbridge.json"), "--stdio",
            "--agent", "wire"]
    return argv, {}, "fx."


def _received(tmp_path: Path) -> list[dict[str, Any]]:
    """What the server read, but the gateway's own tools/list requests."""
    lines = (tmp_path / "received.ndjson").read_bytes().splitlines()
    return [m for m in map(json.loads, lines) if not str(m.get("id", "")).startswith("drawbridge-catalogue-")]


def _incidents(tmp_path: Path, code: int | None = None) -> list[dict[str, Any]]:
    entries = trace(tmp_path / "evidence", "relay_incident")
    return [e["body"] for e in entries if code is None or e["body"].get("code") == code]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
async def test_a_method_another_reader_takes_for_tools_call_is_refused_recorded_and_never_sent(
    tmp_path: Path, era: str, mode: str
) -> None:
    argv, env, prefix = _gateway(tmp_path, mode, 60)
    params: dict[str, Any] = {"name": prefix + "delete_all", "arguments": {}}
    if era == "2026-07-28":
        params["_meta"] = MODERN
    async with raw_pipe(argv, env) as pipe:
        if era == "2025-11-25":
            await pipe.initialize()
        for n, method in enumerate(DISGUISED):
            line = json.dumps({"jsonrpc": "2.0", "id": 33 + n, "method": method, "params": params})
            await pipe.send(line.encode() + b"\n")
            answer = json.loads(await pipe.response_line(33 + n))
            assert answer["error"]["code"] == -32601 and "not exactly 'tools/call'" in answer["error"]["message"]
        ran = await pipe.request(40, "tools/call", {**params, "name": prefix + "safe_read"})
        assert ran["result"]["content"][0]["text"] == "ran safe_read"  # the gateway goes on
    assert [m.get("id") for m in _received(tmp_path) if "delete_all" in json.dumps(m)] == []
    assert len(_incidents(tmp_path, -32601)) == len(DISGUISED)


async def test_a_number_that_reads_as_zero_is_refused_and_never_sent(tmp_path: Path) -> None:
    """A server reading decimals exactly would see a positive number where policy saw 0."""
    argv, env = _argv(tmp_path)
    async with raw_pipe(argv, env) as pipe:
        await pipe.initialize()
        await pipe.send(b'{"jsonrpc":"2.0","id":"tiny","method":"tools/call",'
                        b'"params":{"name":"safe_read","arguments":{"n":1e-400}}}\n')
        answer = await pipe.recv()
        assert answer["id"] is None and answer["error"]["code"] == -32700
        assert "too small for a double" in answer["error"]["message"]
    assert [m for m in _received(tmp_path) if m.get("id") == "tiny"] == []
    assert [i["kind"] for i in _incidents(tmp_path, -32700)] == ["parse_error"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("tool", "problem"), [
    ("repeated_is_error", "repeats a key"),
    ("nan_answer", "NaN and Infinity are not JSON"),
    ("tiny_number", "too small for a double"),
])
async def test_an_answer_without_one_reading_is_dropped_and_its_call_answered_at_once(
    tmp_path: Path, tool: str, problem: str, mode: str
) -> None:
    """The agent would read the line as the server wrote it, the record the gateway's reading of it:
    the line is dropped, and the call it provably answers is answered -32603 and recorded so, by
    both commands."""
    argv, env, prefix = _gateway(tmp_path, mode, 600)
    async with raw_pipe(argv, env) as pipe:
        await pipe.initialize()
        answer = await pipe.request(7, "tools/call", {"name": prefix + tool, "arguments": {}})
        assert (await pipe.request(8, "tools/call", {"name": prefix + "safe_read"}))["result"]  # goes on
    assert answer["error"]["code"] == -32603 and problem in answer["error"]["message"], answer
    [record] = decisions(tmp_path / "evidence", prefix + tool)
    assert record["outcome"] == "upstream_error" and problem in record["error"]
    assert [i["kind"] for i in _incidents(tmp_path) if problem in i["detail"]] == ["upstream_garbage"]


@pytest.mark.parametrize("mode", MODES)
async def test_an_answer_with_two_ids_names_no_request_and_its_call_times_out(tmp_path: Path, mode: str) -> None:
    argv, env, prefix = _gateway(tmp_path, mode, 1)
    async with raw_pipe(argv, env) as pipe:
        await pipe.initialize()
        answer = await pipe.request(307, "tools/call", {"name": prefix + "repeated_id", "arguments": {}})
    assert answer["error"]["code"] == -32001, answer
    [record] = decisions(tmp_path / "evidence", prefix + "repeated_id")
    assert record["outcome"] == "timeout"
    assert any("repeats a key" in i["detail"] for i in _incidents(tmp_path) if i["kind"] == "upstream_garbage")


async def test_a_request_before_initialize_and_a_second_initialize_are_refused(tmp_path: Path) -> None:
    """As serve --stdio does (errors.md, -32600): nothing but ping before initialize, one initialize;
    the gateway reads no catalogue from a server nobody initialized."""
    argv, env = _argv(tmp_path)
    again = {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "again", "version": "0"}}
    async with raw_pipe(argv, env) as pipe:
        early = await pipe.request(1, "tools/call", {"name": "safe_read", "arguments": {}})
        listed = await pipe.request(2, "tools/list")
        assert "result" in await pipe.request(3, "ping")
        initialized = await pipe.initialize()
        second = await pipe.request(4, "initialize", again)
        ran = await pipe.request(5, "tools/call", {"name": "safe_read", "arguments": {}})
    for refused in (early, listed):
        assert refused["error"]["code"] == -32600 and "not initialized" in refused["error"]["message"], refused
    assert second["error"] == {"code": -32600, "message": "invalid request: the session is already initialized"}
    assert initialized["result"]["protocolVersion"] == "2025-11-25"
    assert ran["result"]["content"][0]["text"] == "ran safe_read"
    lines = (tmp_path / "received.ndjson").read_bytes().splitlines()
    first = [json.loads(line).get("method") for line in lines[:3]]
    assert first == ["ping", "initialize", "notifications/initialized"]
    assert [m.get("id") for m in _received(tmp_path) if m.get("method") == "initialize"] == ["init"]
    assert {1, 2, 4} & {m.get("id") for m in _received(tmp_path)} == set()
    assert len(_incidents(tmp_path, -32600)) == 3
