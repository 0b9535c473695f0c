"""Who may use the control plane: whoever presents the admin token, and nobody else.

Invariant: no control-plane handler runs unless ``AdminAuth.check`` returned None for its request, and
that needs the admin token, from every caller, loopback included. There is no mode without a
credential: a loopback caller may be an agent with a shell on the same host, and what the control
plane does (approve a call, make a grant, edit a policy, accept a pin) is for a person. When the
configuration names no token, the gateway makes one and keeps it in a file only its user can read
(``gateway.runtime.admin_token``).

The request must carry exactly one ``Authorization: Bearer <token>`` header and ``sha256(token)`` must
equal the configured digest, compared with ``hmac.compare_digest`` over the two hex digests (constant
time; the token itself is never compared, stored, logged or echoed). A missing, malformed, repeated
or wrong ``Authorization`` is 401 ``{"error": "control plane requires admin authorization"}`` with
``WWW-Authenticate``. Proxy headers (``Forwarded``, ``X-Forwarded-For`` and kin) grant nothing.
The one path answered without the check is a browser's own ``GET /favicon.ico``: 404, empty, unlogged
(it is no route, and a browser sends it with no credential after any page or answer that names no icon).

Theory of operation. ``AdminAuth`` is built once from the digest (checked: 64 lowercase hex).
``guard(endpoint)`` wraps a Starlette endpoint so the check runs before it; the control plane wraps
every route it defines, so mounting ``control_routes`` on any app carries the check with it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request

from drawbridge.activity_log import refused_login
from starlette.responses import JSONResponse, Response

ADMIN_REQUIRED: Final = "control plane requires admin authorization"
WWW_AUTHENTICATE: Final = 'Bearer realm="drawbridge-control-plane"'
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
BROWSER_ICON: Final = "/favicon.ico"

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE} if self.status == 401 else None
        return JSONResponse({"error": self.message}, status_code=self.status, headers=headers)


def _headers(scope: dict[str, Any] | Any, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


class AdminAuth:
    """The control plane's access check (module docstring)."""

    def __init__(self, admin_token_sha256: str) -> None:
        if not isinstance(admin_token_sha256, str) or _HEX64.fullmatch(admin_token_sha256) is None:
            raise ValueError(
                "the control plane needs a credential: admin_token_sha256 must be the token's SHA-256 as 64 "
                "lowercase hex characters"
            )
        self._digest = admin_token_sha256

    def check(self, scope: Any) -> Refusal | None:
        """None when the request may proceed, else the refusal to answer with."""
        if self._token_matches(scope):
            return None
        refused_login("control_plane", scope)
        return Refusal(401, ADMIN_REQUIRED)

    def _token_matches(self, scope: Any) -> bool:
        values = _headers(scope, b"authorization")
        if len(values) != 1:
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return False
        return self.token_matches(token)

    def token_matches(self, token: bytes) -> bool:
        """Whether ``token`` is the admin token (its SHA-256 compared in constant time); the console's
        login form checks its ``token`` field with this."""
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


class AuthFirst:
    """ASGI middleware: the admin check before routing, for every path outside ``open_mounts``, so a
    path that does not exist answers a caller without the token as a real route does (401), and the
    routes cannot be told apart unauthenticated."""

    def __init__(self, app: Any, *, auth: AdminAuth, open_mounts: tuple[str, ...] = ()) -> None:
        self.app, self.auth, self.open_mounts = app, auth, open_mounts

    def _open(self, path: str) -> bool:
        return any(path == mount or path.startswith(mount + "/") for mount in self.open_mounts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == BROWSER_ICON and scope.get("method") in ("GET", "HEAD"):
            # A browser asks this by itself, with no credential, after showing anything that names no
            # icon: answered as absent, and not logged as a refused login (it presented none).
            await Response(status_code=404, headers={"Cache-Control": "max-age=86400"})(scope, receive, send)
            return
        if scope["type"] == "http" and not self._open(scope.get("path", "")):
            refusal = self.auth.check(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = [
    "ADMIN_REQUIRED",
    "AdminAuth",
    "AuthFirst",
    "Refusal",
]
