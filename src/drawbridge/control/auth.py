"""Who may use the control plane: the admin token, or, when none is configured, loopback callers only.

Invariant: no control-plane handler runs unless ``AdminAuth.check`` returned None for its request.

* An admin token is configured (``auth.admin`` in the configuration; the gateway holds only its
  SHA-256): the request must carry ``Authorization: Bearer <token>`` and ``sha256(token)`` must equal
  the configured digest, compared with ``hmac.compare_digest`` over the two hex digests (constant
  time; the token itself is never compared, stored, logged or echoed). This holds for every caller,
  loopback included. A missing, malformed, repeated or wrong ``Authorization`` is 401
  ``{"error": "control plane requires admin authorization"}``.
* No admin token is configured: only a caller whose TCP peer address (the ASGI ``client``; uvicorn
  fills it) is loopback (127.0.0.0/8, ::1, or an IPv4-mapped 127.x) is served. Anyone else is 403.

Proxy headers (``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP`` and kin) never grant anything.
Without a token, a request that carries one is refused (403) even from a loopback peer: a reverse
proxy on the same host would otherwise turn every remote caller into a loopback one. For the same
reason a request that a browser sends (``Origin``, ``Sec-Fetch-*``) or whose ``Host`` is not a loopback
address or ``localhost`` is refused: a web page open on this host (or a DNS-rebinding one) would
otherwise reach the control plane from loopback. (uvicorn, by
default, also rewrites ``client`` from ``X-Forwarded-For`` when the peer is 127.0.0.1 or ::1; that
can only make a loopback-looking request look remote, never the reverse, and the header rule above
refuses it either way.) To put the control plane behind a proxy, configure an admin token.

Theory of operation. ``AdminAuth`` is built once from the configured digest (checked: 64 lowercase
hex, or None). ``guard(endpoint)`` wraps a Starlette endpoint so the check runs before it; the
control plane wraps every route it defines, so mounting ``control_routes`` on any app carries the
check with it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

ADMIN_REQUIRED: Final = "control plane requires admin authorization"
LOOPBACK_ONLY: Final = (
    "control plane requires admin authorization: no admin token is configured, "
    "so only loopback callers are served"
)
PROXIED: Final = (
    "control plane requires admin authorization: no admin token is configured and this request was "
    "relayed by a proxy, so it is not a loopback caller"
)
PROXY_HEADERS: Final = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-real-ip", b"x-client-ip", b"true-client-ip", b"cf-connecting-ip"}
)
BROWSER: Final = (
    "control plane requires admin authorization: no admin token is configured, so requests a browser "
    "sends (Origin or Sec-Fetch headers) or that name a host other than a loopback address are refused"
)
BROWSER_HEADERS: Final = frozenset({b"origin", b"sec-fetch-site", b"sec-fetch-mode"})
WWW_AUTHENTICATE: Final = 'Bearer realm="drawbridge-control-plane"'
_HEX64: Final = re.compile(r"[0-9a-f]{64}")

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE} if self.status == 401 else None
        return JSONResponse({"error": self.message}, status_code=self.status, headers=headers)


def is_loopback(host: object) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped 127.x; False for anything else, names included."""
    if not isinstance(host, str) or not host:
        return False
    text = host.strip("[]").split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _headers(scope: dict[str, Any] | Any, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def _has_proxy_header(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(key.lower() in PROXY_HEADERS for key, _ in headers)


def _browser_or_foreign_host(scope: Any) -> bool:
    """A request a web page could have made: it carries browser fetch headers, or its Host names
    something other than a loopback literal or ``localhost`` (a DNS-rebinding page's own name)."""
    headers = scope.get("headers", ())
    if any(key.lower() in BROWSER_HEADERS for key, _ in headers):
        return True
    hosts = _headers(scope, b"host")
    if not hosts:
        return False
    name = hosts[0].decode("latin-1").strip()
    if name.startswith("["):
        name = name[: name.find("]") + 1]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    return name.lower() != "localhost" and not is_loopback(name)


class AdminAuth:
    """The control plane's access check (module docstring)."""

    def __init__(self, admin_token_sha256: str | None) -> None:
        if admin_token_sha256 is not None and (
            not isinstance(admin_token_sha256, str) or _HEX64.fullmatch(admin_token_sha256) is None
        ):
            raise ValueError("admin_token_sha256 must be the token's SHA-256 as 64 lowercase hex characters")
        self._digest = admin_token_sha256

    def check(self, scope: Any) -> Refusal | None:
        """None when the request may proceed, else the refusal to answer with."""
        if self._digest is not None:
            return None if self._token_matches(scope) else Refusal(401, ADMIN_REQUIRED)
        if _has_proxy_header(scope.get("headers", ())):
            return Refusal(403, PROXIED)
        # A web page in a browser on this host is a loopback caller too: without a token, refuse what
        # only a browser sends (cross-site requests need no preflight for a text/plain POST).
        if _browser_or_foreign_host(scope):
            return Refusal(403, BROWSER)
        client = scope.get("client")
        host = client[0] if client else None
        return None if is_loopback(host) else Refusal(403, LOOPBACK_ONLY)

    def _token_matches(self, scope: Any) -> bool:
        assert self._digest is not None
        values = _headers(scope, b"authorization")
        if len(values) != 1:
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return False
        presented = hashlib.sha256(token).hexdigest()
        return hmac.compare_digest(presented, self._digest)

    def guard(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` behind the check; the refusal is answered without calling it."""

        @functools.wraps(endpoint)
        async def guarded(request: Request) -> Response:
            refusal = self.check(request.scope)
            if refusal is not None:
                return refusal.response()
            return await endpoint(request)

        return guarded


__all__ = [
    "ADMIN_REQUIRED",
    "LOOPBACK_ONLY",
    "PROXIED",
    "PROXY_HEADERS",
    "AdminAuth",
    "Refusal",
    "is_loopback",
]
