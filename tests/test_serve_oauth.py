"""``/mcp`` as an OAuth 2.1 resource server, against a real issuer on a loopback port.

The mcp SDK client's own OAuth support (client credentials) finds the issuer from the 401 and the
RFC 9728 document, gets a token for this resource and calls a tool; tokens that must not pass (another
audience, expired, another issuer, a withdrawn key) are refused with a 401 that names the metadata; a
missing scope is a 403 ``insufficient_scope``; the upstream sees its own credential, never the agent's.
"""

from __future__ import annotations

import json
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from conftest import MODERN, SERVERS, scaled
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from oauth_support import HeaderRecorder, Issuer, ec_key, rsa_key, running_issuer, serve_in_thread
from serve_support import Running, free_port, http_gateway, sha256, write_config

pytestmark = pytest.mark.anyio

STATIC_TOKEN = "static-token-of-the-ops-bot"
OPS_SUBJECT = "ops-bot-client"
"""An OAuth client the agents table maps to the static agent ``ops-bot``."""
UPSTREAM_SECRET = "upstream-credential-7d1f"
LOG_WAIT_SECONDS = scaled(20.0)
"""How long a line the gateway logs may take to reach the test (it is read from its stderr by a thread)."""
CLIENTS = {"agent-a": "secret-a", "reader": "secret-r"}
SCOPES = {"agent-a": "mcp regional:lookup", "reader": "mcp"}


class _Memory:
    """Token storage for the SDK's OAuth provider, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def _regional_upstream() -> HeaderRecorder:
    """The regional fixture server over streamable HTTP (2026-07-28), its request headers written down."""
    server = runpy.run_path(str(SERVERS / "regional.py"), run_name="fixture")["server"]
    return HeaderRecorder(server.streamable_http_app(json_response=True))


def _config(tmp_path: Path, issuer: Issuer, upstream_url: str, **oauth: Any) -> Path:
    settings = {
        "authorization_servers": [{"issuer": issuer.url}],
        "scopes": ["mcp"],
        "tool_scopes": {"regional:lookup": ["regional.lookup"]},
        "jwks_min_refresh_seconds": 0,
        # Beside static agents the claim values are mapped; the ops bot's own subject reaches its agent id.
        "agents": {"agent-a": "agent-a", "reader": "reader", OPS_SUBJECT: "ops-bot"},
        **oauth,
    }
    upstream = {
        "name": "regional", "transport": "streamable_http", "url": f"{upstream_url}/mcp", "protocol": MODERN,
        "headers_env": {"Authorization": "REGIONAL_AUTHORIZATION"},
    }
    auth = {"agents": [{"agent": "ops-bot", "token_sha256": sha256(STATIC_TOKEN)}], "oauth": settings}
    return write_config(tmp_path, [upstream], auth=auth)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Issuer, HeaderRecorder]]:
    recorder = _regional_upstream()
    with running_issuer(clients=dict(CLIENTS), scopes=dict(SCOPES)) as issuer, serve_in_thread(recorder) as upstream_url:
        config = _config(tmp_path_factory.mktemp("oauth"), issuer, upstream_url)
        with http_gateway(config, env={"REGIONAL_AUTHORIZATION": f"Bearer {UPSTREAM_SECRET}"}) as gateway:
            yield gateway, issuer, recorder


def _modern_call(region: str, query: str, header_region: str | None) -> tuple[dict[str, str], dict[str, Any]]:
    body = {
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {
            "name": "regional.lookup", "arguments": {"region": region, "query": query},
            "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}},
        },
    }
    headers = {
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "regional.lookup",
    }
    if header_region is not None:
        headers["mcp-param-region"] = header_region
    return headers, body


def _post(url: str, token: str | None, headers: dict[str, str] | None = None, body: Any = None) -> httpx.Response:
    sent = dict(headers or {"content-type": "application/json", "accept": "application/json, text/event-stream"})
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    payload = body if body is not None else _modern_call("eu", "tea", "eu")[1]
    if headers is None:
        sent.update(_modern_call("eu", "tea", "eu")[0])
    return httpx.post(url, headers=sent, content=json.dumps(payload), timeout=scaled(30))


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_the_sdk_client_signs_in_with_client_credentials_and_calls_a_tool(world: Any, mode: str) -> None:
    gateway, issuer, recorder = world
    assert gateway.url is not None
    provider = ClientCredentialsOAuthProvider(
        server_url=gateway.url, storage=_Memory(), client_id="agent-a", client_secret="secret-a", issuer=issuer.url
    )
    before = len(recorder.seen)
    async with httpx2.AsyncClient(auth=provider, timeout=scaled(30)) as http:
        async with Client(streamable_http_client(gateway.url, http_client=http), mode=mode, cache=None) as client:
            result = await client.call_tool("regional.lookup", {"region": "eu", "query": "tea"})
    assert not result.is_error, result
    assert result.content[0].text == "tea in eu"
    assert issuer.token_requests[-1]["resource"] == gateway.url  # RFC 8707: a token for this resource
    access = provider.context.current_tokens.access_token
    seen = recorder.seen[before:]
    calls = [h for h in seen if h.get("mcp-method") == "tools/call"]
    assert calls and all(h.get("mcp-param-region") == "eu" for h in calls)  # mirrored for the upstream
    assert all(h.get("authorization") == f"Bearer {UPSTREAM_SECRET}" for h in seen)
    assert not any(access in value for h in seen for value in h.values())  # never the agent's token
    assert access not in gateway.text()


async def test_a_request_without_a_token_is_told_where_the_resource_metadata_is(world: Any) -> None:
    gateway, issuer, _ = world
    response = _post(gateway.url, None)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    origin = gateway.url.removesuffix("/mcp")
    assert challenge == f'Bearer resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"'
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        document = httpx.get(origin + path, timeout=scaled(30)).json()
        assert document["resource"] == gateway.url
        assert document["authorization_servers"] == [issuer.url]
        assert document["scopes_supported"] == ["mcp", "regional:lookup"]
        # The metadata answers only to the names /mcp answers to (listen.allowed_hosts), like every path.
        foreign = httpx.get(origin + path, headers={"host": "evil.example"}, timeout=scaled(30))
        assert foreign.status_code == 421 and "listen.allowed_hosts" in foreign.json()["error"]["message"]


def _logged(gateway: Running, fragment: str) -> str:
    """The gateway's log once ``fragment`` is in it (the answer can arrive before the line is read)."""
    gateway.wait_until(lambda text: fragment in text, LOG_WAIT_SECONDS)
    return gateway.text()


def _refused(world: Any, token: str) -> str:
    gateway, _, _ = world
    response = _post(gateway.url, token)
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge and "resource_metadata=" in challenge
    return response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("another_resource", "issued for another resource"),
        ("no_audience", "invalid"),
        ("expired", "expired"),
        ("not_yet_valid", "not valid yet"),
        ("untrusted_issuer", "issuer this resource does not trust"),
        ("forged_key", "key its issuer does not publish"),
        ("no_expiry", "invalid"),
        ("bad_agent_claim", "names no agent"),
        ("hmac", "algorithm"),
    ],
)
async def test_tokens_that_must_not_pass_are_refused_and_logged_without_the_token(world: Any, case: str, reason: str) -> None:
    gateway, issuer, _ = world
    resource = gateway.url
    scope = "mcp regional:lookup"
    tokens = {
        "another_resource": lambda: issuer.mint(aud="http://127.0.0.1:1/mcp", scope=scope),
        "no_audience": lambda: issuer.mint(scope=scope),
        "expired": lambda: issuer.mint(aud=resource, scope=scope, lifetime=-300),
        "not_yet_valid": lambda: issuer.mint(aud=resource, scope=scope, nbf=int(time.time()) + 600),
        "untrusted_issuer": lambda: issuer.mint(aud=resource, scope=scope, iss="http://127.0.0.1:1/other"),
        "forged_key": lambda: issuer.mint(aud=resource, scope=scope, key=rsa_key("key-forged")),
        "no_expiry": lambda: issuer.mint(aud=resource, scope=scope, exp=None),
        "bad_agent_claim": lambda: issuer.mint(aud=resource, scope=scope, sub="not an agent id!"),
        "hmac": lambda: jwt.encode({"iss": issuer.url, "aud": resource, "sub": "x"}, "k" * 32, "HS256"),
    }
    token = tokens[case]()
    assert reason in _refused(world, token)
    text = _logged(gateway, reason)
    assert "WARNING login_refused" in text and "listener=mcp problem=invalid_token" in text
    assert token not in text and token.split(".")[2] not in text


async def test_a_token_from_another_trusted_looking_issuer_is_refused(world: Any) -> None:
    """A second authorization server on loopback mints tokens for this very resource: not configured,
    so not trusted, even with the right audience and its own published keys."""
    gateway, _, _ = world
    with running_issuer() as other:
        token = other.mint(aud=gateway.url, scope="mcp regional:lookup")
        assert "does not trust" in _refused(world, token)


async def test_a_missing_scope_is_a_403_that_names_it(world: Any) -> None:
    gateway, issuer, _ = world
    no_scope = issuer.mint(aud=gateway.url, sub="reader", scope="other")
    response = _post(gateway.url, no_scope)
    assert response.status_code == 403
    assert response.headers["www-authenticate"].startswith('Bearer error="insufficient_scope"')
    assert 'scope="mcp"' in response.headers["www-authenticate"]
    reader = issuer.mint(aud=gateway.url, sub="reader", scope="mcp")
    response = _post(gateway.url, reader)  # tools/call of regional.lookup needs regional:lookup
    assert response.status_code == 403
    assert 'scope="regional:lookup"' in response.headers["www-authenticate"]
    assert "scope regional:lookup missing" in _logged(gateway, "scope regional:lookup missing")


async def test_a_static_token_and_oauth_are_both_on(world: Any) -> None:
    gateway, issuer, _ = world
    for token in (STATIC_TOKEN, issuer.mint(aud=gateway.url, scope="mcp regional:lookup")):
        response = _post(gateway.url, token)
        assert response.status_code == 200, response.text
        assert response.json()["result"]["content"][0]["text"] == "tea in eu"


async def test_a_session_belongs_to_the_credential_that_opened_it_not_only_to_its_agent_id(world: Any) -> None:
    """The static token and a JWT whose subject the agents table maps to the same agent are two
    credentials: neither reaches a session the other opened (404, as for an unknown id)."""
    gateway, issuer, _ = world
    jwt_token = issuer.mint(aud=gateway.url, sub=OPS_SUBJECT, scope="mcp regional:lookup")
    for opener, other in ((STATIC_TOKEN, jwt_token), (jwt_token, STATIC_TOKEN)):
        session = _open_session(gateway.url, opener)
        assert _post(gateway.url, opener, session, _LISTING).status_code == 200
        taken = _post(gateway.url, other, session, _LISTING)
        assert taken.status_code == 404 and "unknown or ended session" in taken.text


_LEGACY = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
_LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def _open_session(url: str, token: str) -> dict[str, str]:
    """A 2025-era session opened with ``token``: the headers that use it."""
    opened = _post(url, token, _LEGACY, _INITIALIZE)
    assert opened.status_code == 200, opened.text
    return {**_LEGACY, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}


async def test_an_oauth_subject_mapped_to_a_static_agent_holds_its_own_sessions(tmp_path: Path) -> None:
    """``max_sessions_per_agent`` counts a credential's sessions: the subject the agents table maps to
    the static agent's id opening sessions ends none of the static token's, only its own."""
    with running_issuer() as issuer, serve_in_thread(_regional_upstream()) as upstream_url:
        config = _config(tmp_path, issuer, upstream_url)
        document = json.loads(config.read_text(encoding="utf-8"))
        config.write_text(json.dumps({**document, "limits": {"max_sessions_per_agent": 2}}), encoding="utf-8")
        with http_gateway(config, env={"REGIONAL_AUTHORIZATION": "Bearer x"}) as gateway:
            assert gateway.url is not None
            static = [_open_session(gateway.url, STATIC_TOKEN) for _ in range(2)]
            subject = issuer.mint(aud=gateway.url, sub=OPS_SUBJECT, scope="mcp regional:lookup")
            flood = [_open_session(gateway.url, subject) for _ in range(3)]
            for headers in static:  # the static token's two sessions are still there
                assert _post(gateway.url, STATIC_TOKEN, headers, _LISTING).status_code == 200
            ended = _post(gateway.url, subject, flood[0], _LISTING)  # the subject's third ended its own first
            assert ended.status_code == 404 and "unknown or ended session" in ended.text
            assert all(_post(gateway.url, subject, h, _LISTING).status_code == 200 for h in flood[1:])


async def test_scp_as_a_space_separated_string_grants_its_scopes(world: Any) -> None:
    """Entra ID sends ``scp`` as one string, space-separated like ``scope``."""
    gateway, issuer, _ = world
    token = issuer.mint(aud=gateway.url, scp="mcp regional:lookup")
    response = _post(gateway.url, token)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["content"][0]["text"] == "tea in eu"
    narrow = issuer.mint(aud=gateway.url, sub="reader", scp="mcp")  # regional.lookup needs regional:lookup
    assert 'scope="regional:lookup"' in _post(gateway.url, narrow).headers["www-authenticate"]


async def test_a_discovered_jwks_uri_over_plain_http_to_another_host_is_a_503_and_a_line_naming_the_issuer(
    tmp_path: Path,
) -> None:
    """The issuer's metadata names a key URL that a configured ``jwks_uri`` could not be: nothing is
    fetched from it (``.invalid`` is never resolved), the request is refused 503 and the log says why."""
    with running_issuer(jwks_uri="http://keys.invalid:9913/jwks") as issuer, serve_in_thread(_regional_upstream()) as upstream_url:
        config = _config(tmp_path, issuer, upstream_url)
        with http_gateway(config, env={"REGIONAL_AUTHORIZATION": "Bearer x"}) as gateway:
            response = _post(gateway.url, issuer.mint(aud=gateway.url, scope="mcp regional:lookup"))
            assert response.status_code == 503, response.text
            assert "signing keys could not be fetched" in response.json()["error"]["message"]
            text = _logged(gateway, "uses plain http on a host that is not loopback")
            assert f"the signing keys of issuer {issuer.url} could not be fetched: the jwks_uri in the metadata at" in text


@pytest.mark.parametrize(("header", "problem"), [("us", "does not match"), (None, "missing")])
async def test_an_mcp_param_header_that_disagrees_with_the_body_is_refused(world: Any, header: str | None, problem: str) -> None:
    gateway, _, recorder = world
    before = len(recorder.seen)
    headers, body = _modern_call("eu", "tea", header)
    response = _post(gateway.url, STATIC_TOKEN, headers, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32020 and problem in error["message"]
    assert not any(h.get("mcp-method") == "tools/call" for h in recorder.seen[before:])  # never forwarded


async def test_a_rotated_key_is_fetched_on_its_first_kid_and_the_withdrawn_one_is_refused(tmp_path: Path) -> None:
    with running_issuer() as issuer, serve_in_thread(_regional_upstream()) as upstream_url:
        config = _config(tmp_path, issuer, upstream_url)
        with http_gateway(config, env={"REGIONAL_AUTHORIZATION": "Bearer x"}) as gateway:
            old = issuer.mint(aud=gateway.url, scope="mcp regional:lookup")
            assert _post(gateway.url, old).status_code == 200
            issuer.rotate(ec_key("key-2"))
            new = issuer.mint(aud=gateway.url, scope="mcp regional:lookup")
            fetches = issuer.jwks_fetches
            assert _post(gateway.url, new).status_code == 200  # unknown kid: the key set is fetched again
            assert issuer.jwks_fetches == fetches + 1
            assert "key its issuer does not publish" in _refused((gateway, issuer, None), old)


async def test_a_tool_with_an_invalid_x_mcp_header_is_not_offered(world: Any) -> None:
    gateway, _, _ = world
    headers, _ = _modern_call("eu", "tea", "eu")
    headers["mcp-method"] = "tools/list"
    del headers["mcp-name"], headers["mcp-param-region"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": _modern_call("eu", "t", None)[1]["params"]["_meta"]}}
    names = [t["name"] for t in _post(gateway.url, STATIC_TOKEN, headers, body).json()["result"]["tools"]]
    assert names == ["regional.lookup"]  # regional.weigh puts x-mcp-header on a number
    assert "tool 'weigh' is not offered" in _logged(gateway, "tool 'weigh' is not offered")


async def test_when_the_keys_cannot_be_fetched_the_request_is_refused_with_503(tmp_path: Path) -> None:
    """Fail closed: an issuer that does not answer, and one whose metadata names another issuer
    (its keys are not taken), leave nothing to check a token against."""
    with running_issuer() as issuer, serve_in_thread(_regional_upstream()) as upstream_url:
        dead = f"http://127.0.0.1:{free_port()}"
        impostor = f"{issuer.url}/"  # the metadata at this address says its issuer is issuer.url
        config = _config(tmp_path, issuer, upstream_url, authorization_servers=[{"issuer": dead}, {"issuer": impostor}])
        with http_gateway(config, env={"REGIONAL_AUTHORIZATION": "Bearer x"}) as gateway:
            for iss in (dead, impostor):
                token = issuer.mint(aud=gateway.url, scope="mcp regional:lookup", iss=iss)
                response = _post(gateway.url, token)
                assert response.status_code == 503, response.text
                assert "signing keys could not be fetched" in response.json()["error"]["message"]
            text = _logged(gateway, "names another issuer")
            assert "names another issuer" in text and token not in text


async def test_an_agent_that_declares_the_tasks_extension_gets_the_call_decided_and_answered_at_once(world: Any) -> None:
    """The gateway offers no tasks: the extension an agent declares is not declared upstream, so the
    upstream cannot turn the call into a task; the policy decides it and the result comes back."""
    gateway, _, recorder = world
    headers, body = _modern_call("eu", "tea", "eu")
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    }
    before = len(recorder.bodies)
    response = _post(gateway.url, STATIC_TOKEN, headers, body)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["resultType"] == "complete" and result["content"][0]["text"] == "tea in eu"
    sent = [json.loads(b) for b in recorder.bodies[before:] if b]
    calls = [m for m in sent if m.get("method") == "tools/call"]
    assert calls and not any("io.modelcontextprotocol/tasks" in json.dumps(m) for m in calls)


async def test_the_control_plane_keeps_its_own_credential(world: Any) -> None:
    """An agent's access token, however valid at /mcp, opens nothing on the control plane."""
    gateway, issuer, _ = world
    token = issuer.mint(aud=gateway.url, scope="mcp regional:lookup")
    control = gateway.control()
    assert httpx.get(f"{control}/tools", headers={"authorization": f"Bearer {token}"}, timeout=scaled(30)).status_code == 401
    assert httpx.get(f"{control}/tools", headers=gateway.control_headers(), timeout=scaled(30)).status_code == 200
