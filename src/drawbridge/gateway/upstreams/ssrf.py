"""The SSRF guard: HTTP clients that connect only to public addresses, unless told otherwise.

Invariant: a client from ``http_client(allow_private=False)`` never opens a connection to a loopback,
link-local, private, reserved, multicast or unspecified address (``config.private_address_problem``),
whatever the URL names: the check is made on the addresses a host name resolves to, at the moment of
connecting, and the connection is made to the address that was checked, so a name that resolves to a
public address when checked and to a private one when used (DNS rebinding) gains nothing. A host that
resolves to any refused address is refused whole. Redirects are never followed by these clients
(callers decide, per redirect, see ``openapi.calls``); proxies from the environment are not used, so
no proxy stands between the check and the connection. Nor do these clients keep cookies: a cookie one
answer sets is never sent with a later call, which may be another agent's.

Theory of operation. httpx sends through httpcore's connection pool, which opens connections through
a network backend; ``GuardedBackend`` wraps anyio's: it resolves the host, checks every address, then
connects to the first one. TLS is started afterwards on that connection with the URL's host name, so
certificates are checked against the name, not the address. A refusal is an ``AddressRefused``
(an httpcore ``ConnectError``), which httpx raises as its own ``ConnectError`` caused by it.
"""

from __future__ import annotations

import socket
from http.cookiejar import CookieJar, DefaultCookiePolicy
from collections.abc import Iterable
from typing import Any, Final

import anyio
import httpcore
import httpx

from drawbridge.config import private_address_problem

USER_AGENT: Final = "drawbridge"


class AddressRefused(httpcore.ConnectError):
    """The guard refused to connect: the host is, or resolves to, a non-public address."""


def refusal(exc: BaseException) -> AddressRefused | None:
    """The guard's refusal behind an httpx error, if that is what it is."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, AddressRefused):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, connecting only to public addresses (module docstring)."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        problem = private_address_problem(host)
        if problem is not None:
            raise AddressRefused(f"the SSRF guard refuses {host}: {problem}")
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            problem = private_address_problem(address)
            if problem is not None:
                raise AddressRefused(f"the SSRF guard refuses {host}: it resolves to {problem}")
        return await self._backend.connect_tcp(
            addresses[0], port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("the SSRF guard refuses Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


async def resolved_problem(host: str) -> str | None:
    """Why the guard would refuse to connect to ``host`` now (checked when ``serve`` starts, so that a
    backend on a private address is a startup error rather than a refusal on every call). A name that
    does not resolve now is no refusal: it is checked again on every connection."""
    problem = private_address_problem(host)
    if problem is not None:
        return problem
    try:
        infos = await anyio.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for info in infos:
        problem = private_address_problem(str(info[4][0]))
        if problem is not None:
            return f"{host} resolves to {problem}"
    return None


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a pool whose connections go through ``GuardedBackend``."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        # httpx builds its pool without a way to pass a network backend: the pool is replaced by one
        # with the same TLS context and the guarded backend (tests/test_openapi_upstream.py checks that
        # the refusal happens, so a change in httpx cannot silently drop the guard).
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=GuardedBackend()
        )


def http_client(*, allow_private: bool, timeout: float, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """An HTTP client for an OpenAPI upstream: guarded unless ``allow_private``; no redirects followed,
    no environment proxies, no cookies kept."""
    transport: httpx.AsyncBaseTransport = (
        httpx.AsyncHTTPTransport(trust_env=False) if allow_private else _GuardedTransport()
    )
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # keeps none (module docstring)
    )


__all__ = ["AddressRefused", "GuardedBackend", "http_client", "refusal", "resolved_problem"]
