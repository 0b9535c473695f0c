"""``drawbridge serve`` at 2026-07-28 over HTTP (raw requests, exact headers), at the edges of that era:
the methods it removed, refusals of a request's params, an upstream's errors that would read as the
gateway's own, and an envelope whose version is not text.

* ``ping``, ``logging/setLevel`` and the ``resources/subscribe`` pair are not part of 2026-07-28: -32601
  with 404, recorded, and never relayed (a subscription made for a request that ends with its answer
  could deliver nothing); a handshake session still subscribes.
* Every refusal of a message is recorded (docs/errors.md), the -32602 refusals of params too, with the
  agent that sent it, never the content.
* An upstream's -32020, -32021 and -32022 refuse the request the gateway wrote to it: a 2026-07-28 agent
  gets -32603 naming the code, not a header or version refusal of its own (no ``data.supported`` to
  fall back by); the HTTP status of an upstream's error follows errors.md (200 but for -32600, -32602,
  -32601), its -32700 included.
* ``params._meta["io.modelcontextprotocol/protocolVersion"]`` that is not a string is a malformed
  envelope: -32602 naming the key, not a header mismatch.

A real gateway process in front of ``fixtures/servers/era_answers.py`` (a raw 2025-11-25 stdio server
whose ``fail`` tool answers the error code its arguments name) and ``fixtures/servers/subscribing.py``
(which says what subscriptions it was asked for); with two upstreams offering resources, a URI
neither lists routes to none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from approval_support import trace
from conftest import LEGACY_VERSION, MODERN, PYTHON, SERVERS, scaled
from serve_support import Running, http_gateway, initialize_request, sha256, write_config

from drawbridge.gateway.protocol.hop import modern_error, relayed_codes

TOKEN = "token-of-agent-edge"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
ENVELOPE = {VERSION_KEY: MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
SECRET = "a-uri-value-never-recorded"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("edges")
    upstreams = [{"name": "era", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "era_answers.py")]},
                 {"name": "notes", "transport": "stdio", "command": PYTHON, "args": [str(SERVERS / "subscribing.py")]}]
    config = write_config(directory, upstreams, fsync="never",
                          auth={"agents": [{"agent": "edge", "token_sha256": sha256(TOKEN)}]})
    with http_gateway(config) as running:
        yield running


def _post(running: Running, method: str, params: dict[str, Any] | None = None, *,
          meta: dict[str, Any] | None = None) -> httpx.Response:
    assert running.url is not None
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}",
               "mcp-protocol-version": MODERN, "mcp-method": method}
    named = (params or {}).get("uri" if method.startswith("resources/") else "name")
    if isinstance(named, str):
        headers["mcp-name"] = named
    body = {"jsonrpc": "2.0", "id": 5, "method": method, "params": {**(params or {}), "_meta": meta or ENVELOPE}}
    return httpx.post(running.url, headers=headers, content=json.dumps(body), timeout=scaled(30))


def _incidents(running: Running) -> list[dict[str, Any]]:
    assert running.config is not None
    return [e["body"] for e in trace(running.config.parent / "evidence", "relay_incident")]


def _refused_and_recorded(running: Running, response: httpx.Response, status: int, code: int) -> dict[str, Any]:
    """The one incident this refusal left (the trace is written before the answer), checked."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    found = [i for i in _incidents(running) if i["detail"] == error["message"]]
    assert len(found) >= 1, (error, _incidents(running))
    incident = found[-1]
    assert (incident["kind"], incident["code"], incident["direction"], incident["agent"]) == (
        "invalid_message", code, "client", "edge"), incident
    assert SECRET not in json.dumps(incident)
    return error


@pytest.mark.parametrize(("method", "params", "instead"), [
    ("ping", None, None),
    ("logging/setLevel", {"level": "info"}, "logLevel"),
    ("resources/subscribe", {"uri": "note://a"}, "subscriptions/listen"),
    ("resources/unsubscribe", {"uri": "note://a"}, "subscriptions/listen"),
])
def test_a_method_2026_removed_is_not_found_and_recorded(
    gateway: Running, method: str, params: dict[str, Any] | None, instead: str | None
) -> None:
    error = _refused_and_recorded(gateway, _post(gateway, method, params), 404, -32601)
    assert "is not part of 2026-07-28, which removed it" in error["message"], error
    assert instead is None or instead in error["message"], error


def _held(running: Running) -> dict[str, Any]:
    """What the notes upstream says it was asked to subscribe to."""
    answer = _post(running, "tools/call", {"name": "notes.subscriptions", "arguments": {}})
    return json.loads(answer.json()["result"]["content"][0]["text"])  # type: ignore[no-any-return]


def test_the_subscribe_pair_reaches_no_upstream_at_2026_and_a_handshake_session_still_subscribes(
    gateway: Running,
) -> None:
    assert gateway.url is not None
    for method in ("resources/subscribe", "resources/unsubscribe"):
        assert _post(gateway, method, {"uri": "note://a"}).status_code == 404
    assert (_held(gateway)["subscribe"], _held(gateway)["unsubscribe"]) == (0, 0)
    headers = {"content-type": "application/json", "accept": "application/json", "authorization": f"Bearer {TOKEN}"}
    opened = httpx.post(gateway.url, headers=headers, content=json.dumps(initialize_request()), timeout=scaled(30))
    session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": LEGACY_VERSION}
    request = {"jsonrpc": "2.0", "id": 3, "method": "resources/subscribe", "params": {"uri": "note://a"}}
    answer = httpx.post(gateway.url, headers=session, content=json.dumps(request), timeout=scaled(30))
    assert answer.json() == {"jsonrpc": "2.0", "id": 3, "result": {}}, answer.text
    assert _held(gateway)["subscribed"] == ["note://a"]
    httpx.delete(gateway.url, headers=session, timeout=scaled(30))  # its subscription is released


@pytest.mark.parametrize(("method", "params", "said"), [
    ("tools/list", {"cursor": "zzz"}, "the gateway issued no such cursor"),
    ("resources/read", {"uri": f"nope://{SECRET}"}, "no upstream lists this resource URI"),
    ("prompts/get", {"name": "nobody.nothing"}, "unknown prompt"),
    ("completion/complete", {"ref": {"type": "ref/none"}, "argument": {"name": "a", "value": SECRET}}, "ref.type"),
    ("subscriptions/listen", {"notifications": []}, "notifications must be an object"),
])
def test_a_refusal_of_params_is_recorded_with_its_agent(
    gateway: Running, method: str, params: dict[str, Any], said: str
) -> None:
    error = _refused_and_recorded(gateway, _post(gateway, method, params), 400, -32602)
    assert error["message"].startswith("invalid params: ") and said in error["message"], error


@pytest.mark.parametrize("code", [-32020, -32021, -32022])
def test_an_upstreams_header_and_version_errors_do_not_pass_for_the_gateways(gateway: Running, code: int) -> None:
    """The upstream (a 2025-11-25 server) refused what the gateway sent it; the agent's request was
    fine, so it is told of an internal error naming the upstream's code, with the status of one."""
    response = _post(gateway, "tools/call", {"name": "era.fail", "arguments": {"code": code}})
    assert response.status_code == 200, response.text
    error = response.json()["error"]
    assert error["code"] == -32603 and str(code) in error["message"] and "data" not in error, error
    assert gateway.config is not None
    entries = trace(gateway.config.parent / "evidence", "tool_decision")
    assert entries[-1]["body"]["error_code"] == -32603, entries[-1]


@pytest.mark.parametrize(("code", "status"), [(-32700, 200), (-32603, 200), (-32000, 200), (-32600, 400),
                                              (-32602, 400), (-32601, 404)])
def test_the_status_of_an_upstreams_error_follows_errors_md(gateway: Running, code: int, status: int) -> None:
    response = _post(gateway, "tools/call", {"name": "era.fail", "arguments": {"code": code}})
    assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text


@pytest.mark.parametrize("version", [20260728, None, ["2026-07-28"]])
def test_an_envelope_version_that_is_not_text_is_invalid_params_naming_the_key(gateway: Running, version: Any) -> None:
    response = _post(gateway, "tools/list", meta={**ENVELOPE, VERSION_KEY: version})
    error = _refused_and_recorded(gateway, response, 400, -32602)
    assert VERSION_KEY in error["message"] and "must be a string" in error["message"], error


def test_the_defined_codes_pass_only_where_they_speak_of_what_the_agent_sent() -> None:
    """serve writes its own envelope, version and headers to an upstream, and passes a 2026-07-28 one
    the capabilities the agent declared (its -32021 is about them); wrap relays the agent's call as it
    came (the server's -32022 is its answer to the agent, whose ``data.supported`` it falls back by)."""
    wrap, modern_upstream, old_upstream = (relayed_codes(envelope=True), relayed_codes(capabilities=True),
                                           relayed_codes())
    for code in (-32020, -32021, -32022):
        error = {"code": code, "message": "no", "data": {"supported": ["2025-11-25"]}}
        assert modern_error(error, passed=old_upstream)["code"] == -32603
        assert modern_error(error, passed=wrap) is error
        assert (modern_error(error, passed=modern_upstream) is error) is (code == -32021)
    assert modern_error({"code": -32050, "message": "no"}, passed=wrap)["code"] == -32603
    assert modern_error({"code": -32002, "message": "gone"}, passed=wrap)["code"] == -32602
