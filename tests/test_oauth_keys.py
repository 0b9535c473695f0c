"""The issuers' key sets (``gateway.transports.oauth_keys``) against a real issuer on a loopback port:
found by RFC 8414 metadata, fetched again for an unknown ``kid`` at most once per interval, however
many requests present invented ones at once."""

from __future__ import annotations

import anyio
import httpx
import pytest
from oauth_support import ec_key, running_issuer

from drawbridge.config_oauth import IssuerConfig, OAuthConfig
from drawbridge.gateway.transports.oauth_keys import IssuerKeys, KeysUnavailable, metadata_urls

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
