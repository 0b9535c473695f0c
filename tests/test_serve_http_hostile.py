"""``drawbridge serve`` at /mcp against hostile requests: DNS rebinding, repeated credentials, floods of
sessions.

A real gateway process serves each test; well-formed flows use the mcp SDK client, hostile requests
raw httpx (a browser page that a rebinding name points at this host sends what they send here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import MODERN, scaled
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from serve_support import GITHUB, SLACK, Running, dump, http_gateway, initialize_request, sha256, write_config
from serve_support import http_client as sdk_client

from drawbridge.evidence.chain import verify_chain

ALICE, BOB, CAROL = "alice-secret-token", "bob-secret-token", "carol-secret-token"
AGENTS = [
    {"agent": "alice", "token_sha256": sha256(ALICE)},
    {"agent": "bob", "token_sha256": sha256(BOB)},
    {"agent": "carol", "token_sha256": sha256(CAROL)},
]
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INITIALIZE = initialize_request()
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _port(running: Running) -> int:
    assert running.url is not None
    return httpx.URL(running.url).port or 0


def _post(url: str, body: Any, headers: Any) -> httpx.Response:
    """A POST with exactly the headers given (a list of pairs may repeat a header)."""
    with httpx.Client(timeout=scaled(30)) as client:
        request = client.build_request("POST", url, content=json.dumps(body), headers=httpx.Headers(headers))
        return client.send(request)


def _trace(running: Running) -> tuple[str, list[dict[str, Any]]]:
    assert running.config is not None
    path = running.config.parent / "evidence" / "trace.ndjson"
    text = path.read_text()
    return text, [json.loads(line) for line in text.splitlines()]


def _incidents(entries: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["body"] for e in entries if e["kind"] == "relay_incident" and e["body"]["kind"] == kind]


def _verify_chain(running: Running) -> None:
    """The hash chain of a gateway still running: every link holds (its run is not sealed yet, so
    ``drawbridge evidence verify-chain`` would call it incomplete)."""
    assert running.config is not None
    with open(running.config.parent / "evidence" / "trace.ndjson", "rb") as trace:
        report = verify_chain(trace)
    assert report.ok, report


@pytest.fixture(scope="module")
def anonymous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A loopback gateway (port 0) with an anonymous agent: no credential stands in a page's way."""
    config = write_config(
        tmp_path_factory.mktemp("rebinding"), [GITHUB], auth={"agents": AGENTS, "anonymous_agent": "guest"}
    )
    with http_gateway(config) as running:
        yield running


# ------------------------------------------------------------------------------------ DNS rebinding


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/mcp/"), ("GET", "/mcp/"), ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/readyz/"),
     ("GET", "/nowhere")],
)
def test_every_path_of_the_listener_answers_only_to_an_allowed_host(anonymous: Running, method: str, path: str) -> None:
    """The Host check is in front of every route, not only /mcp: a rebinding page reads no status
    (readyz names the upstreams) and is never redirected to its own name."""
    assert anonymous.url is not None
    base, port = anonymous.url.removesuffix("/mcp"), _port(anonymous)
    with httpx.Client(timeout=scaled(30), follow_redirects=False) as client:
        foreign = client.request(method, base + path, headers={**JSON_HEADERS, "host": "evil.example"}, json=INITIALIZE)
        assert foreign.status_code == 421, (foreign.status_code, foreign.headers)
        assert "location" not in foreign.headers and "github" not in foreign.text
        own = client.request(method, base + path, headers={**JSON_HEADERS, "host": f"127.0.0.1:{port}"}, json=INITIALIZE)
    # With the allowed name: the health checks answer, and /mcp/ is not /mcp (no redirect, 404).
    assert own.status_code == (200 if path in ("/healthz", "/readyz") else 404), own.text
    assert "location" not in own.headers



def test_a_rebinding_page_opens_no_session_and_runs_no_call(anonymous: Running) -> None:
    url, port = anonymous.url, _port(anonymous)
    assert url is not None
    evil = {**JSON_HEADERS, "host": "evil.example", "origin": "http://evil.example"}
    opened = _post(url, INITIALIZE, evil)
    assert opened.status_code == 421
    assert "mcp-session-id" not in opened.headers
    assert opened.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": opened.json()["error"]["message"]},
    }
    assert "listen.allowed_hosts" in opened.json()["error"]["message"]
    # The same page with its own port, and a 2026-07-28 call that needs no session at all.
    assert _post(url, INITIALIZE, {**evil, "host": f"evil.example:{port}"}).status_code == 421
    call = {
        "jsonrpc": "2.0",
        "id": "rebound-call",
        "method": "tools/call",
        "params": {"_meta": ENVELOPE, "name": "github.delete_repo", "arguments": {"owner": "o", "name": "n"}},
    }
    modern = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "github.delete_repo"}
    ran = _post(url, call, {**evil, **modern})
    assert ran.status_code == 421 and ran.json()["error"]["code"] == -32600
    # A loopback Host with a foreign page's Origin, an opaque origin, or another scheme: 403.
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"file://127.0.0.1:{port}"):
        refused = _post(url, call, {**JSON_HEADERS, **modern, "host": f"127.0.0.1:{port}", "origin": origin})
        assert refused.status_code == 403, origin
        assert (
            refused.json()["error"]["code"] == -32600
            and "listen.allowed_hosts" in refused.json()["error"]["message"]
        )
    # The allowed Host with a second, foreign Origin header is not read one way or the other.
    twice = [*JSON_HEADERS.items(), ("origin", f"http://127.0.0.1:{port}"), ("origin", "http://evil.example")]
    assert _post(url, INITIALIZE, [*twice, ("host", f"127.0.0.1:{port}")]).status_code == 403

    text, entries = _trace(anonymous)
    assert not [
        e for e in entries if e["kind"] == "tool_decision" and e["body"].get("request_id") == "rebound-call"
    ]
    assert len(_incidents(entries, "foreign_host")) >= 3
    assert len(_incidents(entries, "foreign_origin")) >= 5
    assert "evil.example" not in text  # what the page sent is not recorded, only the rule it broke
    _verify_chain(anonymous)


@pytest.mark.anyio
async def test_the_loopback_names_with_the_bound_port_are_served(anonymous: Running) -> None:
    url, port = anonymous.url, _port(anonymous)
    assert url is not None
    async with sdk_client(url, "legacy") as guest:  # Host: 127.0.0.1:<the port bound for port 0>
        assert [t.name for t in (await guest.list_tools()).tools]
    async with sdk_client(url, MODERN) as guest:
        assert (await guest.list_tools()).tools
    for host in (
        f"localhost:{port}",
        f"LOCALHOST:{port}",
        f"[::1]:{port}",
        f"[0:0::1]:{port}",
        f"127.0.0.1:{port}",
    ):
        same_origin = {**JSON_HEADERS, "host": host, "origin": f"http://{host}"}
        answered = _post(url, INITIALIZE, same_origin)
        assert answered.status_code == 200, host
        assert answered.json()["result"]["serverInfo"]["name"] == "drawbridge"
    for host in (
        "localhost",
        f"localhost:{port + 1}",
        f"127.0.0.1:{port}@evil.example",
        f"127.0.0.1:{port}/x",
        "*",
    ):
        assert _post(url, INITIALIZE, {**JSON_HEADERS, "host": host}).status_code == 421, host


@pytest.mark.anyio
async def test_configured_allowed_hosts_replace_the_loopback_names(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        [GITHUB],
        listen={
            "host": "127.0.0.1",
            "port": 0,
            "allowed_hosts": ["Gateway.Test", "proxy.test:8443", "any.test:*"],
        },
        auth={"agents": AGENTS},
    )
    with http_gateway(config) as running:
        url, port = running.url, _port(running)
        assert url is not None
        # The listening address is not on the list: the summary says which Host to send, and the
        # health check it prints answers with that header (421 without it).
        base = url.rsplit("/mcp", 1)[0]
        needs = f"with the header Host: gateway.test (127.0.0.1:{port} is not in listen.allowed_hosts)"
        assert f"{base}/healthz and {base}/readyz {needs}" in running.text(), running.text()
        assert f"on {url} (1 up, 0 down) {needs}" in running.text()
        with httpx.Client(trust_env=False, timeout=scaled(10)) as plain:
            assert plain.get(f"{base}/healthz").status_code == 421
            assert plain.get(f"{base}/healthz", headers={"host": "gateway.test"}).status_code == 200
        headers = {"Host": f"gateway.test:{port}", "Authorization": f"Bearer {ALICE}"}
        async with (
            create_mcp_http_client(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as alice,
        ):
            listed = dump(await alice.call_tool("github.list_repos", {"owner": "acme"}))
        assert listed["structuredContent"] == {"result": ["anvil", "rocket"]}

        alice_auth = {**JSON_HEADERS, "authorization": f"Bearer {ALICE}"}
        for host in ("gateway.test", f"gateway.test:{port}", "proxy.test:8443", "any.test", "any.test:1"):
            assert _post(url, INITIALIZE, {**alice_auth, "host": host}).status_code == 200, host
        origin = {**alice_auth, "host": "gateway.test", "origin": "https://gateway.test"}
        assert _post(url, INITIALIZE, origin).status_code == 200
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "gateway.test:1",
            "proxy.test",
            f"proxy.test:{port}",
        ):
            assert _post(url, INITIALIZE, {**alice_auth, "host": host}).status_code == 421, host
        foreign = {**alice_auth, "host": "gateway.test", "origin": f"http://127.0.0.1:{port}"}
        assert _post(url, INITIALIZE, foreign).status_code == 403


# ---------------------------------------------------------------------------- repeated credentials


def test_two_authorization_headers_are_refused(anonymous: Running) -> None:
    url, port = anonymous.url, _port(anonymous)
    assert url is not None
    base = [*JSON_HEADERS.items(), ("host", f"127.0.0.1:{port}")]
    for pair in ((ALICE, ALICE), (BOB, ALICE), ("not-a-token", ALICE)):
        twice = [*base, ("authorization", f"Bearer {pair[0]}"), ("authorization", f"Bearer {pair[1]}")]
        refused = _post(url, INITIALIZE, twice)
        assert refused.status_code == 401, pair
        assert refused.headers["www-authenticate"] == "Bearer"
        assert "mcp-session-id" not in refused.headers
        error = refused.json()["error"]
        assert error["code"] == -32600 and "more than one Authorization header" in error["message"]
        assert ALICE not in refused.text and BOB not in refused.text
    session = _post(url, INITIALIZE, [*base, ("authorization", f"Bearer {ALICE}")]).headers["mcp-session-id"]
    on_session = [
        *base,
        ("mcp-session-id", session),
        ("authorization", f"Bearer {ALICE}"),
        ("authorization", f"Bearer {ALICE}"),
    ]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    assert _post(url, ping, on_session).status_code == 401
    with httpx.Client(timeout=scaled(30)) as client:
        gone = client.send(client.build_request("DELETE", url, headers=httpx.Headers(on_session)))
    assert gone.status_code == 401
    single = [*base, ("mcp-session-id", session), ("authorization", f"Bearer {ALICE}")]
    assert _post(url, ping, single).json() == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {},
    }  # the session is intact
    text, entries = _trace(anonymous)
    assert len(_incidents(entries, "repeated_authorization")) >= 5
    assert ALICE not in text and BOB not in text and ALICE not in anonymous.text()


# ---------------------------------------------------------------------------------------- sessions


async def _initialize_many(url: str, token: str, count: int, workers: int = 8) -> list[str]:
    """``count`` initializes by one agent, ``workers`` at a time; the session ids in the order given."""
    ids: list[str | None] = [None] * count
    turn = iter(range(count))
    headers = {**JSON_HEADERS, "authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=scaled(60)) as client:

        async def worker() -> None:
            for i in turn:
                response = await client.post(
                    url, content=json.dumps({**INITIALIZE, "id": i}), headers=headers
                )
                assert response.status_code == 200, response.text
                ids[i] = response.headers["mcp-session-id"]

        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(worker)
    assert all(ids)
    return [sid for sid in ids if sid is not None]


def _ping(url: str, token: str, session: str) -> int:
    headers = {**JSON_HEADERS, "authorization": f"Bearer {token}", "mcp-session-id": session}
    return httpx.post(
        url, content=b'{"jsonrpc":"2.0","id":"p","method":"ping"}', headers=headers, timeout=scaled(30)
    ).status_code


@pytest.mark.anyio
@pytest.mark.timeout(300)  # 1,100 initializes; a loaded machine is slow
async def test_one_agents_initializes_never_end_another_agents_session(tmp_path: Path) -> None:
    config = write_config(tmp_path, [GITHUB, SLACK], auth={"agents": AGENTS})
    with http_gateway(config) as running:
        url = running.url
        assert url is not None
        async with sdk_client(url, "legacy", ALICE) as alice:
            first = dump(await alice.call_tool("github.list_repos", {"owner": "acme"}))
            # Eight at a time, then the last 65 one by one: which sessions are the most recent is then
            # known (concurrent initializes may be served in any order).
            flood = await _initialize_many(url, BOB, 1035) + await _initialize_many(url, BOB, 65, workers=1)
            after = dump(await alice.call_tool("slack.list_channels", {}))
        assert first["structuredContent"] == {"result": ["anvil", "rocket"]}
        assert after["isError"] is False and "general" in after["structuredContent"]
        # Bob keeps his 64 most recent sessions (the default limits.max_sessions_per_agent); the rest ended.
        assert len(set(flood)) == 1100
        assert {_ping(url, BOB, sid) for sid in flood[-64:]} == {200}
        assert {_ping(url, BOB, sid) for sid in flood[:16]} == {404}
        assert _ping(url, BOB, flood[-65]) == 404


@pytest.mark.anyio
async def test_at_the_global_limit_a_new_agent_waits_and_no_agent_loses_a_session_to_another(
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path, [GITHUB], auth={"agents": AGENTS}, limits={"max_sessions_per_agent": 2, "max_sessions": 4}
    )
    with http_gateway(config) as running:
        url = running.url
        assert url is not None
        alice = await _initialize_many(url, ALICE, 2, workers=1)
        bob = await _initialize_many(url, BOB, 2, workers=1)
        headers = {**JSON_HEADERS, "authorization": f"Bearer {CAROL}"}
        async with httpx.AsyncClient(timeout=scaled(30)) as client:
            full = await client.post(url, content=json.dumps({**INITIALIZE, "id": "c1"}), headers=headers)
        assert full.status_code == 503 and full.headers["retry-after"]
        assert full.json()["id"] == "c1" and full.json()["error"]["code"] == -32600
        assert "limits.max_sessions" in full.json()["error"]["message"]
        assert "mcp-session-id" not in full.headers
        # Alice, at the global limit with sessions of her own, makes room from her own.
        assert _ping(url, ALICE, alice[0]) == 200  # alice[1] is now her least recently used
        third = await _initialize_many(url, ALICE, 1, workers=1)
        assert [_ping(url, ALICE, sid) for sid in (alice[0], alice[1], third[0])] == [200, 404, 200]
        assert [_ping(url, BOB, sid) for sid in bob] == [200, 200]
        # Once Bob ends one of his, Carol gets a session.
        async with httpx.AsyncClient(timeout=scaled(30)) as client:
            ended = await client.delete(
                url, headers={"authorization": f"Bearer {BOB}", "mcp-session-id": bob[0]}
            )
        assert ended.status_code == 204
        async with sdk_client(url, "legacy", CAROL) as carol:
            assert (await carol.list_tools()).tools
        _text, entries = _trace(running)
        assert _incidents(entries, "session_limit")
