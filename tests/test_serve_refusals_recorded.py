"""Every refusal of a message under ``drawbridge serve`` is recorded in the trace (docs/errors.md), in the
2026-07-28 era too, over HTTP and over stdio: a routing header missing, repeated or not matching the
body (-32020), an envelope without its keys (-32602), a version the gateway does not speak (-32022),
a tools/call sent as a notification, a response from a 2026-07-28 client. Each record names the rule
broken, never an argument value, and nothing refused reaches the upstream. Over stdio, the envelope's
version is checked first and a handshake version in the envelope is refused with the reason.

A real gateway runs as a process in front of tests/fixtures/servers/recording.py, which writes down
every line it receives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from approval_support import trace
from conftest import LEGACY_VERSION, MODERN, PYTHON, SERVERS, eventually, raw_pipe, scaled
from serve_support import Running, http_gateway, serve_argv, sha256, write_config

TOKEN = "token-of-agent-a"
SECRET = "an-argument-value-never-recorded"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
VERSION_KEY, CAPABILITIES_KEY = ENVELOPE


def _recording(directory: Path) -> tuple[Path, Path]:
    log = directory / "received.ndjson"
    upstream = {"name": "rec", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "recording.py")],
                "env": {"RECORDING_LOG": str(log)}}
    config = write_config(directory, [upstream], fsync="never", auth={"agents": [{"agent": "a", "token_sha256": sha256(TOKEN)}]})
    return config, log


def _incidents(evidence: Path) -> list[dict[str, Any]]:
    return [e["body"] for e in trace(evidence, "relay_incident")]


def _calls_received(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [m for m in map(json.loads, lines) if m.get("method") == "tools/call"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    config, log = _recording(tmp_path_factory.mktemp("refusals"))
    with http_gateway(config) as running:
        yield running, log


def _call(name: str = "rec.delete_all", meta: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": {"path": SECRET}, "_meta": ENVELOPE if meta is None else meta}
    return {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": params, **fields}


def _headers(*extra: tuple[str, str], name: str | None = "rec.delete_all", method: str = "tools/call") -> list[tuple[str, str]]:
    headers = [("content-type", "application/json"), ("accept", "application/json"), ("authorization", f"Bearer {TOKEN}"),
               ("mcp-protocol-version", MODERN), ("mcp-method", method)]
    return headers + ([("mcp-name", name)] if name is not None else []) + list(extra)


def _post(running: Running, body: dict[str, Any], headers: list[tuple[str, str]]) -> httpx.Response:
    assert running.url is not None
    with httpx.Client(timeout=scaled(30)) as client:
        request = client.build_request("POST", running.url, content=json.dumps(body), headers=httpx.Headers(headers))
        return client.send(request)


def _new_incidents(running: Running, before: int, count: int = 1) -> list[dict[str, Any]]:
    assert running.config is not None
    evidence = running.config.parent / "evidence"
    found = eventually(lambda: (lambda all: all[before:] if len(all) >= before + count else None)(_incidents(evidence)),
                       what=f"{count} new relay_incident entries")
    assert len(found) == count, found
    return found


def _count(running: Running) -> int:
    assert running.config is not None
    return len(_incidents(running.config.parent / "evidence"))


@pytest.mark.parametrize(("body", "headers", "code", "said"), [
    pytest.param(_call(), _headers(name="rec.safe_read"), -32020, "mcp-name header does not match", id="name-mismatch"),
    pytest.param(_call(), _headers(name=None), -32020, "mcp-name header is missing", id="name-missing"),
    pytest.param(_call(), _headers(("mcp-name", "rec.safe_read")), -32020, "mcp-name header appears more than once",
                 id="name-repeated"),
    pytest.param(_call(), _headers(method="Tools/call"), -32020, "mcp-method header does not match", id="method-case"),
    pytest.param(_call(meta={VERSION_KEY: MODERN}), _headers(), -32602,
                 f"invalid params: params._meta is missing the required envelope key(s): {CAPABILITIES_KEY}",
                 id="no-capabilities-key"),
    pytest.param(_call(meta={**ENVELOPE, CAPABILITIES_KEY: None}), _headers(), -32602, "invalid params:",
                 id="capabilities-null"),
    pytest.param(_call(meta={**ENVELOPE, VERSION_KEY: "2030-01-01"}),
                 [(k, "2030-01-01" if k == "mcp-protocol-version" else v) for k, v in _headers()], -32022,
                 "Unsupported protocol version", id="unsupported-version"),
    pytest.param({"jsonrpc": "2.0", "id": 42, "result": {}}, _headers(), -32600,
                 "a 2026-07-28 client does not send responses", id="a-response"),
])
def test_a_2026_request_refused_over_http_is_recorded(
    gateway: tuple[Running, Path], body: dict[str, Any], headers: list[tuple[str, str]], code: int, said: str
) -> None:
    running, log = gateway
    before = _count(running)
    response = _post(running, body, headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code and said in response.json()["error"]["message"], response.text
    [incident] = _new_incidents(running, before)
    assert (incident["kind"], incident["code"], incident["direction"]) == ("invalid_message", code, "client"), incident
    assert incident["detail"] == response.json()["error"]["message"]
    assert SECRET not in json.dumps(incident)
    assert not any(m["params"]["name"] == "delete_all" for m in _calls_received(log))  # nothing reached the upstream


def test_a_2026_tools_call_notification_over_http_is_recorded(gateway: tuple[Running, Path]) -> None:
    running, log = gateway
    before = _count(running)
    notification = {key: value for key, value in _call().items() if key != "id"}
    response = _post(running, notification, _headers())
    assert response.status_code == 202
    [incident] = _new_incidents(running, before)
    assert incident["kind"] == "tools_call_notification" and SECRET not in json.dumps(incident), incident
    assert not any(m["params"]["name"] == "delete_all" for m in _calls_received(log))


@pytest.mark.anyio
async def test_envelope_refusals_over_stdio_are_recorded_checking_the_version_first(tmp_path: Path) -> None:
    config, log = _recording(tmp_path)
    async with raw_pipe(serve_argv(config, "--stdio", "--agent", "a")) as pipe:
        async def call(request_id: int, meta: dict[str, Any]) -> dict[str, Any]:
            return (await pipe.request(request_id, "tools/call", _call(meta=meta)["params"]))["error"]

        handshake = await call(1, {**ENVELOPE, VERSION_KEY: LEGACY_VERSION})
        bogus = await call(2, {VERSION_KEY: "1999"})  # no clientCapabilities either: the version is said first
        missing = await call(3, {VERSION_KEY: MODERN})
        null = await call(4, {**ENVELOPE, CAPABILITIES_KEY: None})
        number = await call(5, {**ENVELOPE, VERSION_KEY: 20260728})  # malformed, not unsupported
    assert handshake["code"] == -32022 and LEGACY_VERSION in handshake["data"]["supported"], handshake
    assert "handshake-era version" in handshake["message"] and "initialize" in handshake["message"], handshake
    assert bogus["code"] == -32022 and bogus["data"]["requested"] == "1999", bogus
    assert bogus["message"] == "Unsupported protocol version"
    assert missing["code"] == -32602 and missing["message"] == (
        f"invalid params: params._meta is missing the required envelope key(s): {CAPABILITIES_KEY}"
    ), missing
    assert null["code"] == -32602 and null["message"].startswith("invalid params:"), null
    assert number["code"] == -32602 and number["message"].startswith(f"invalid params: params._meta['{VERSION_KEY}']")
    incidents = [i for i in _incidents(tmp_path / "evidence") if i["kind"] == "invalid_message"]
    assert [(i["code"], i["detail"]) for i in incidents] == [
        (error["code"], error["message"]) for error in (handshake, bogus, missing, null, number)
    ]
    assert SECRET not in json.dumps(incidents)
    assert _calls_received(log) == []
