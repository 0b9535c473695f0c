"""The authorization servers' public keys (JWKS), fetched, cached and refreshed off the call path.

Invariant: a token is checked only against a key fetched from its own issuer's ``jwks_uri`` (named in
the configuration, or in the issuer's RFC 8414 metadata whose ``issuer`` equals the configured one
exactly), over https or over plain http to a loopback host only -- the rule of
``config_oauth.transport_problem``, held for a discovered ``jwks_uri`` as for a configured one (a
metadata document that names another is refused: no key is fetched); a key set is replaced whole,
so a key the issuer has withdrawn is gone once the set is fetched again. An unknown ``kid`` fetches
the set at most once per ``jwks_min_refresh_seconds`` per issuer, and concurrent requests share that
one fetch, so tokens with invented key ids cannot make the gateway hammer the issuer.

Theory of operation. ``run`` fetches every issuer's keys at start and again every
``jwks_cache_seconds``, in the background; a request finds its key in a dict. Only a ``kid`` not in
the set awaits a fetch. A fetch (discovery and key set together) is bounded as a whole by
``FETCH_TIMEOUT_SECONDS``, not only each read, so an issuer that trickles its answer cannot hold the
issuer's lock (and with it the refresh that drops a withdrawn key); each document is read as a stream
and given up at ``MAX_DOCUMENT_BYTES``, so an endless answer costs no more memory than that. Fetch
failures are logged with the URL fetched and the reason, and the keys held so far stay in use. A URL
is shown as ``http_link.safe_url`` makes it: scheme, host and path only, since a ``jwks_uri`` an
issuer's metadata names may carry a user name, a password or a query key (the configured ones may
not: ``config_oauth``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from drawbridge.config_oauth import IssuerConfig, OAuthConfig, transport_problem
from drawbridge.gateway.upstreams.http_link import safe_url

logger = logging.getLogger("drawbridge.gateway.oauth")

FETCH_TIMEOUT_SECONDS: Final = 10.0
MAX_DOCUMENT_BYTES: Final = 256 * 1024
RETRY_SECONDS: Final = 5.0


class KeysUnavailable(Exception):
    """The issuer's keys could not be fetched (the message says why; it names no token)."""


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata is: RFC 8414 (well-known before the issuer's path), then OpenID
    Connect Discovery (appended to it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    rfc8414 = urlunsplit((parts.scheme, parts.netloc, f"/.well-known/oauth-authorization-server{path}", "", ""))
    oidc = urlunsplit((parts.scheme, parts.netloc, f"{path}/.well-known/openid-configuration", "", ""))
    return [rfc8414, oidc]


class IssuerKeys:
    """One issuer's key set."""

    def __init__(
        self,
        issuer: IssuerConfig,
        config: OAuthConfig,
        clock: Callable[[], float] = time.monotonic,
        fetch_timeout: float = FETCH_TIMEOUT_SECONDS,
    ) -> None:
        self.issuer = issuer
        self._fetch_timeout = fetch_timeout
        self._config = config
        self._clock = clock
        self._jwks_uri = issuer.jwks_uri
        self._keys: dict[str | None, PyJWK] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._failure: str | None = None
        """Why the last fetch failed (None after a success): with no keys held, a request is told so."""
        self._lock = anyio.Lock()
        self.generation = 0
        """Bumped each time the set changes (verified tokens cached under an older set are dropped)."""

    def held(self, kid: str | None) -> PyJWK | None:
        return self._keys.get(kid)

    async def key(self, client: httpx.AsyncClient, kid: str | None) -> PyJWK | None:
        """The key named ``kid``; an unknown one fetches the set again, unless that happened lately."""
        found = self._keys.get(kid)
        if found is not None:
            return found
        seen = self._attempted_at
        async with self._lock:
            recent = self._attempted_at is not None and (
                self._attempted_at != seen  # another request fetched while this one waited
                or self._clock() - self._attempted_at < self._config.jwks_min_refresh_seconds
            )
            if not recent:
                await self._fetch(client)
            elif self._failure is not None and not self._keys:
                raise KeysUnavailable(self._failure)
        return self._keys.get(kid)

    async def refresh(self, client: httpx.AsyncClient) -> None:
        async with self._lock:
            await self._fetch(client)

    def stale(self) -> bool:
        return self._fetched_at is None or self._clock() - self._fetched_at >= self._config.jwks_cache_seconds

    async def _fetch(self, client: httpx.AsyncClient) -> None:
        self._attempted_at = self._clock()
        try:
            with anyio.fail_after(self._fetch_timeout):
                await self._fetch_now(client)
        except (KeysUnavailable, TimeoutError) as exc:
            late = f"the keys of issuer {self.issuer.issuer} were not fetched within {self._fetch_timeout:g} s"
            self._failure = str(exc) if isinstance(exc, KeysUnavailable) else late
            raise KeysUnavailable(self._failure) from None
        self._failure = None

    async def _fetch_now(self, client: httpx.AsyncClient) -> None:
        if self._jwks_uri is None:
            self._jwks_uri = await self._discover(client)
        document = await _get_json(client, self._jwks_uri)
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise KeysUnavailable(f"the key set at {safe_url(self._jwks_uri)} has no keys list")
        keys: dict[str | None, PyJWK] = {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                jwk = PyJWK(entry)
            except PyJWKError:
                continue  # a key type or algorithm this gateway cannot use: skipped, as RFC 7517 5 allows
            keys[jwk.key_id] = jwk
        if keys.keys() != self._keys.keys() or any(keys[k].key != self._keys[k].key for k in keys):
            self.generation += 1
        self._keys = keys
        self._fetched_at = self._clock()
        logger.info("fetched %d signing key(s) of issuer %s", len(keys), self.issuer.issuer)

    async def _discover(self, client: httpx.AsyncClient) -> str:
        problems: list[str] = []
        for url in metadata_urls(self.issuer.issuer):
            try:
                metadata = await _get_json(client, url)
            except KeysUnavailable as exc:
                problems.append(str(exc))
                continue
            if metadata.get("issuer") != self.issuer.issuer:
                raise KeysUnavailable(f"the metadata at {safe_url(url)} names another issuer")
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise KeysUnavailable(f"the metadata at {safe_url(url)} has no usable jwks_uri")
            if problem := transport_problem(jwks_uri, f"the jwks_uri in the metadata at {safe_url(url)}"):
                raise KeysUnavailable(problem)
            return jwks_uri
        raise KeysUnavailable("; ".join(problems))


async def _get_json(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """The JSON object at ``url``, read as a stream that stops at ``MAX_DOCUMENT_BYTES``."""
    shown = safe_url(url)
    too_large = KeysUnavailable(f"{shown} answered more than {MAX_DOCUMENT_BYTES} bytes")
    body = bytearray()
    try:
        async with client.stream("GET", url, headers={"accept": "application/json"}) as response:
            if response.status_code != 200:
                raise KeysUnavailable(f"{shown} answered HTTP {response.status_code}")
            announced = response.headers.get("content-length", "")
            if announced.isascii() and announced.isdigit() and int(announced) > MAX_DOCUMENT_BYTES:
                raise too_large
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise too_large
    except httpx.HTTPError as exc:
        raise KeysUnavailable(f"fetching {shown} failed ({type(exc).__name__})") from None
    try:
        document = json.loads(body)
    except ValueError:
        raise KeysUnavailable(f"{shown} did not answer JSON") from None
    if not isinstance(document, dict):
        raise KeysUnavailable(f"{shown} did not answer a JSON object")
    return document


class KeyStore:
    """Every configured issuer's keys, and the HTTP client that fetches them."""

    def __init__(self, config: OAuthConfig) -> None:
        self.issuers = {i.issuer: IssuerKeys(i, config) for i in config.issuers}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(FETCH_TIMEOUT_SECONDS), follow_redirects=False, trust_env=False
        )

    @property
    def generation(self) -> int:
        return sum(keys.generation for keys in self.issuers.values())

    async def key(self, issuer: str, kid: str | None) -> PyJWK | None:
        """The key, or None when the issuer has no such key; raises KeysUnavailable when the set
        could not be fetched."""
        return await self.issuers[issuer].key(self._client, kid)

    async def run(self) -> None:
        """Fetch every issuer's keys now and whenever they grow stale, until cancelled."""
        try:
            while True:
                for keys in self.issuers.values():
                    if keys.stale():
                        try:
                            await keys.refresh(self._client)
                        except KeysUnavailable as exc:
                            logger.warning("the signing keys of issuer %s could not be fetched: %s", keys.issuer.issuer, exc)
                await anyio.sleep(RETRY_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                await self._client.aclose()


__all__ = ["FETCH_TIMEOUT_SECONDS", "IssuerKeys", "KeyStore", "KeysUnavailable", "metadata_urls"]
