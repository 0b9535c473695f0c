"""Which names the agents' listener answers to: the ``Host`` and ``Origin`` checks against DNS rebinding.

Invariant: a request reaches any route of the agents' listener (``/mcp`` and its identity check, the
health checks, the OAuth metadata: ``HostGuard`` is in front of them all) only when it carries exactly
one ``Host`` header whose authority is allowed and at most one ``Origin`` header, an ``http``/``https``
origin whose authority is allowed. A web page whose name an attacker points at this host (DNS rebinding)
makes the browser send that name in both headers; it is not on the list, so the page gets 421 or
403 and no session, whatever identity the request would have had (an anonymous agent included).

What is allowed (``listen.allowed_hosts``, normalized by ``drawbridge.config``):

* nothing configured, on a loopback listener: ``127.0.0.1``, ``localhost`` and ``[::1]`` (and the
  loopback address listened on), each with the port actually listened on (``port: 0`` included);
  the configuration refuses a non-loopback ``listen.host`` without a list;
* ``HOST``: that host without a port (as a reverse proxy on the default port forwards it) or with
  the port listened on; ``HOST:PORT``: that port only; ``HOST:*``: any port or none.

Names are compared in lower case and IPv6 literals in their compressed form, so one authority has
one spelling. A ``Host`` that is not an authority (a path, a userinfo, a wildcard) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from starlette.types import ASGIApp, Receive, Scope, Send

from drawbridge.config_hosts import is_loopback_address, split_authority
from drawbridge.gateway.protocol.jsonrpc import INVALID_REQUEST
from drawbridge.gateway.transports.http_wire import header_values, send_error

if TYPE_CHECKING:
    from drawbridge.gateway.serve.hub import Gateway

LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")

HOST_REFUSED: Final = (
    "misdirected request: the Host header names no host this gateway answers to (listen.allowed_hosts)"
)
ORIGIN_REFUSED: Final = (
    "forbidden: the request comes from a web origin this gateway does not answer to (listen.allowed_hosts)"
)


@dataclass(frozen=True, slots=True)
class HostRefusal:
    status: int
    incident: str
    message: str


@dataclass(frozen=True)
class AllowedHosts:
    """The authorities ``/mcp`` answers to, for the port it listens on (module docstring)."""

    exact: frozenset[tuple[str, str | None]]
    any_port: frozenset[str] = frozenset()
    configured: tuple[str, ...] = ()
    """``listen.allowed_hosts`` as configured (normalized, in order); empty for the loopback default."""

    @classmethod
    def build(cls, configured: Sequence[str] | None, listen_host: str, port: int) -> AllowedHosts:
        """From ``listen.allowed_hosts`` (normalized entries), or the loopback default, for ``port``."""
        here = str(port)
        if configured is None:
            names = list(LOOPBACK_NAMES)
            own = split_authority(f"[{listen_host}]" if ":" in listen_host else listen_host)
            if own is not None and own[1] is None and is_loopback_address(listen_host):
                names.append(own[0])
            return cls(frozenset((name, here) for name in names))
        exact: set[tuple[str, str | None]] = set()
        any_port: set[str] = set()
        for entry in configured:
            split = split_authority(entry)
            if split is None:
                raise ValueError(f"not a normalized allowed_hosts entry: {entry!r}")
            host, entry_port = split
            if entry_port == "*":
                any_port.add(host)
            elif entry_port is None:
                exact.update({(host, None), (host, here)})
            else:
                exact.add((host, entry_port))
        return cls(frozenset(exact), frozenset(any_port), tuple(configured))

    def host_to_send(self, listening: str) -> str | None:
        """The ``Host`` a client of the listening address ``listening`` (``host:port``) must send: None
        when that address is admitted as it is, else the first configured entry (``HOST:*`` as
        ``HOST``), so that the URL serve prints is never one that answers 421 without saying so."""
        if self.admits(listening) or not self.configured:
            return None
        first = self.configured[0]
        return first[:-2] if first.endswith(":*") else first

    def admits(self, authority: str) -> bool:
        split = split_authority(authority)
        if split is None:
            return False
        host, port = split
        if port is not None:
            if not port.isdigit() or not 0 < int(port) < 65536:
                return False
            port = str(int(port))
        return host in self.any_port or (host, port) in self.exact

    def check(self, hosts: Sequence[str], origins: Sequence[str]) -> HostRefusal | None:
        """None when the request names an allowed host (and origin), else its refusal.

        ``hosts`` and ``origins`` are every value of the header as sent, so a repeated header, which
        two readers could take differently, is refused rather than read one way.
        """
        if len(hosts) != 1 or not self.admits(hosts[0]):
            return HostRefusal(421, "foreign_host", HOST_REFUSED)
        if not origins:
            return None
        authority = origin_authority(origins[0]) if len(origins) == 1 else None
        if authority is None or not self.admits(authority):
            return HostRefusal(403, "foreign_origin", ORIGIN_REFUSED)
        return None


class HostGuard:
    """ASGI middleware: every request the listener serves, whatever its path, names an allowed host
    before any route sees it; 421 or 403 otherwise, recorded as an incident."""

    def __init__(self, app: ASGIApp, gateway: Gateway, hosts: AllowedHosts) -> None:
        self.app = app
        self.gateway = gateway
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        refusal = self.hosts.check(header_values(scope, "host"), header_values(scope, "origin"))
        if refusal is not None:
            await self.gateway.incident(refusal.incident, "client", refusal.message, INVALID_REQUEST)
            await send_error(send, refusal.status, INVALID_REQUEST, refusal.message)
            return
        await self.app(scope, receive, send)


def origin_authority(origin: str) -> str | None:
    """The ``host[:port]`` of an ``http``/``https`` origin, or None (``null``, another scheme, a path)."""
    scheme, sep, rest = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or any(c in rest for c in "/?#@\\"):
        return None
    return rest


__all__ = [
    "HOST_REFUSED",
    "LOOPBACK_NAMES",
    "ORIGIN_REFUSED",
    "AllowedHosts",
    "HostGuard",
    "HostRefusal",
    "origin_authority",
]
