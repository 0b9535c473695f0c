"""The issuers' key sets (``gateway.transports.oauth_keys``) against a real issuer on a loopback port:
found by RFC 8414 metadata, fetched again for an unknown ``kid`` at most once per interval, however
many requests present invented ones at once; a key URL the metadata names is held to the https rule
of a configured one; a fetch is bounded in time as a whole and in size as it is read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import anyio
import httpx
import pytest
from conftest import scaled
from oauth_support import ec_key, running_issuer, serve_in_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from drawbridge.config_oauth import IssuerConfig, OAuthConfig
from drawbridge.gateway.transports.oauth_keys import MAX_DOCUMENT_BYTES, IssuerKeys, KeysUnavailable, metadata_urls

SERVER_HOLDS_SECONDS: Final = 60.0
"""How long the slow key servers below keep a connection at most (they stop when the client leaves)."""

pytestmark = pytest.mark.anyio


def test_metadata_urls_follow_rfc8414_then_openid_connect() -> None:
    assert metadata_urls("https://login.example.com/realms/a") == [
        "https://login.example.com/.well-known/oauth-authorization-server/realms/a",
        "https://login.example.com/realms/a/.well-known/openid-configuration",
    ]
    assert metadata_urls("https://login.example.com")[0] == "https://login.example.com/.well-known/oauth-authorization-server"


async def test_invented_kids_fetch_the_keys_at_most_once_per_interval() -> None:
    now = [1000.0]
    with running_issuer() as issuer:
        config = OAuthConfig(issuers=(IssuerConfig(issuer.url),), jwks_min_refresh_seconds=30)
        keys = IssuerKeys(config.issuers[0], config, clock=lambda: now[0])
        async with httpx.AsyncClient() as client:
            assert await keys.key(client, "key-1") is not None
            assert issuer.jwks_fetches == 1
            found: list[object] = []

            async def ask(kid: str) -> None:
                found.append(await keys.key(client, kid))

            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(ask, f"invented-{i}")
            assert found == [None] * 50 and issuer.jwks_fetches == 1  # within the interval: no fetch
            issuer.rotate(ec_key("key-2"))
            now[0] += 31
            generation = keys.generation
            assert await keys.key(client, "key-2") is not None  # the interval passed: fetched again
            assert issuer.jwks_fetches == 2 and keys.generation == generation + 1
            assert keys.held("key-1") is None  # withdrawn by the issuer, gone from the set


@pytest.mark.parametrize(
    "jwks_uri",
    ["{url}/gone?api_key=SECRETQ", "http://user:SECRETQ@{host}/gone", "{url}/gone#SECRETQ"],
)
async def test_a_failed_fetch_names_the_url_without_its_credentials_or_query(jwks_uri: str) -> None:
    """The keys' address an issuer's metadata names may carry a secret: the failure (logged at WARNING)
    names where it went, never the user name, password, query or fragment."""
    with running_issuer() as issuer:
        issuer.jwks_uri = jwks_uri.replace("{host}", issuer.url.removeprefix("http://"))
        config = OAuthConfig(issuers=(IssuerConfig(issuer.url),))
        keys = IssuerKeys(config.issuers[0], config)
        async with httpx.AsyncClient() as client:
            with pytest.raises(KeysUnavailable) as failed:
                await keys.key(client, "key-1")
    assert f"{issuer.url}/gone answered HTTP 404" in str(failed.value)
    assert "SECRETQ" not in str(failed.value) and "user" not in str(failed.value)


class _AllToLoopback(httpx.AsyncBaseTransport):
    """Sends every request to one loopback server whatever host its URL names, and writes the hosts
    down: the stand-in for a key server elsewhere, so that no request leaves this machine."""

    def __init__(self, target: str) -> None:
        self._target = httpx.URL(target)
        self._inner = httpx.AsyncHTTPTransport()
        self.hosts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        request.url = request.url.copy_with(scheme="http", host=self._target.host, port=self._target.port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_discovered_jwks_uri_over_plain_http_to_another_host_is_refused_before_any_fetch() -> None:
    """The rule a configured ``jwks_uri`` is held to holds for the one the metadata names: keys fetched
    in the clear from a host that is not loopback could be anyone's, so none are fetched or trusted."""
    with running_issuer(jwks_uri="http://192.0.2.2:9913/jwks") as issuer:
        config = OAuthConfig(issuers=(IssuerConfig(issuer.url),))
        keys = IssuerKeys(config.issuers[0], config)
        transport = _AllToLoopback(issuer.url)
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(KeysUnavailable) as failed:
                await keys.key(client, "key-1")
    assert "uses plain http on a host that is not loopback: use https" in str(failed.value)
    assert "the jwks_uri in the metadata at" in str(failed.value)
    assert transport.hosts == ["127.0.0.1"] and issuer.jwks_fetches == 0  # the metadata only
    assert keys.held("key-1") is None


async def _trickle(_request: Request) -> Response:
    """A key set one byte at a time, each well within a read timeout, the whole never."""

    async def body() -> AsyncIterator[bytes]:
        yield b'{"keys": ['
        for _ in range(int(SERVER_HOLDS_SECONDS / 0.2)):
            await anyio.sleep(0.2)
            yield b" "

    return StreamingResponse(body(), media_type="application/json")


def _endless(announce: bool) -> Route:
    """More than the cap, then nothing until the client leaves: a reader that waits for the end waits."""

    async def answer(_request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"keys": [' + b" " * MAX_DOCUMENT_BYTES
            await anyio.sleep(SERVER_HOLDS_SECONDS)

        headers = {"content-length": str(300 * 1024 * 1024)} if announce else None
        return StreamingResponse(body(), media_type="application/json", headers=headers)

    return Route("/jwks", answer)


async def test_a_key_server_that_trickles_is_given_up_on_as_a_whole_and_the_lock_is_free_again() -> None:
    with serve_in_thread(Starlette(routes=[Route("/jwks", _trickle)])) as url:
        config = OAuthConfig(issuers=(IssuerConfig("http://127.0.0.1:1/realm", f"{url}/jwks"),))
        keys = IssuerKeys(config.issuers[0], config, fetch_timeout=1.0)
        async with httpx.AsyncClient(timeout=scaled(10)) as client:  # each read is quick: only the whole is slow
            for _ in range(2):  # the first fetch ended: the refresh gets the lock and is bounded alike
                with anyio.fail_after(scaled(15)):
                    with pytest.raises(KeysUnavailable, match=r"issuer http://127\.0\.0\.1:1/realm were not fetched within 1 s"):
                        await keys.refresh(client)


@pytest.mark.parametrize("announce", [False, True], ids=["chunked", "content-length"])
async def test_a_key_set_over_the_cap_is_given_up_on_as_it_is_read(announce: bool) -> None:
    """Reading stops at ``MAX_DOCUMENT_BYTES``: the answer is not read whole (here it never ends) first."""
    with serve_in_thread(Starlette(routes=[_endless(announce)])) as url:
        config = OAuthConfig(issuers=(IssuerConfig("http://127.0.0.1:1/realm", f"{url}/jwks"),))
        keys = IssuerKeys(config.issuers[0], config, fetch_timeout=SERVER_HOLDS_SECONDS)
        async with httpx.AsyncClient(timeout=scaled(30)) as client:
            with anyio.fail_after(scaled(10)):
                with pytest.raises(KeysUnavailable, match=f"{url}/jwks answered more than {MAX_DOCUMENT_BYTES} bytes"):
                    await keys.refresh(client)
