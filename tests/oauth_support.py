"""A real OAuth authorization server for the tests, and an HTTP upstream that writes down the headers
it receives; both are served by uvicorn on loopback ports, in a thread of the test process.

The issuer publishes RFC 8414 metadata, a JWKS and a token endpoint for the client-credentials grant;
its signing keys are made in the test (``rotate`` replaces them), and ``mint`` signs any claims the
test wants (an expired token, a token for another resource, a key the issuer never published).
"""

from __future__ import annotations

import base64
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

import jwt
import uvicorn
from conftest import scaled
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from serve_support import wait_for_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

THREAD_STOP_SECONDS: Final = scaled(10.0)
TOKEN_LIFETIME_SECONDS: Final = 600


class _Server(uvicorn.Server):
    """uvicorn in a thread: no signal handlers (the test process owns them)."""

    @contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Serve ``app`` on a free loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(THREAD_STOP_SECONDS)
        sock.close()


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        encoder = RSAAlgorithm if self.algorithm.startswith("RS") else ECAlgorithm
        jwk = encoder.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.algorithm, "use": "sig"}


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


@dataclass
class Issuer:
    """The authorization server: its URL is known once it serves (``issuer.url``)."""

    clients: dict[str, str] = field(default_factory=dict)
    """client_id -> client_secret"""
    scopes: dict[str, str] = field(default_factory=dict)
    """client_id -> the scope its tokens carry"""
    keys: list[SigningKey] = field(default_factory=lambda: [rsa_key("key-1")])
    url: str = ""
    token_requests: list[dict[str, str]] = field(default_factory=list)
    jwks_fetches: int = 0
    jwks_uri: str = "{url}/jwks"
    """The ``jwks_uri`` its metadata names (``{url}`` is its own URL)."""

    def rotate(self, new: SigningKey) -> SigningKey:
        """Publish only ``new`` from now on and sign with it; the old key is returned (withdrawn)."""
        old, self.keys = self.keys[0], [new]
        return old

    def mint(self, *, key: SigningKey | None = None, lifetime: int = TOKEN_LIFETIME_SECONDS, **claims: Any) -> str:
        """A signed access token: iss, sub, aud (the gateway's resource, via ``aud=``), iat, nbf, exp
        defaulted; any claim overridden, or dropped with None."""
        now = int(time.time())
        payload: dict[str, Any] = {"iss": self.url, "sub": "agent-a", "iat": now, "nbf": now, "exp": now + lifetime}
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        signing = key or self.keys[0]
        return jwt.encode(payload, signing.private, algorithm=signing.algorithm, headers={"kid": signing.kid})

    def app(self) -> Starlette:
        async def metadata(_request: Request) -> Response:
            return JSONResponse({
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "jwks_uri": self.jwks_uri.format(url=self.url),
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "response_types_supported": ["code"],
            })

        async def jwks(_request: Request) -> Response:
            self.jwks_fetches += 1
            return JSONResponse({"keys": [k.public_jwk() for k in self.keys]})

        async def token(request: Request) -> Response:
            form = {k: str(v) for k, v in (await request.form()).items()}
            self.token_requests.append({k: v for k, v in form.items() if k != "client_secret"})
            client_id, secret = form.get("client_id"), form.get("client_secret")
            basic = request.headers.get("authorization", "")
            if basic.lower().startswith("basic "):
                client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
                client_id, secret = unquote(client_id), unquote(secret)
            if client_id not in self.clients or not secrets.compare_digest(self.clients[client_id], secret or ""):
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            if form.get("grant_type") != "client_credentials":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            scope = self.scopes.get(client_id, "")
            access = self.mint(sub=client_id, aud=form.get("resource"), scope=scope or None, client_id=client_id)
            body = {"access_token": access, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME_SECONDS}
            if scope:
                body["scope"] = scope
            return JSONResponse(body, headers={"cache-control": "no-store"})

        return Starlette(routes=[
            Route("/.well-known/oauth-authorization-server", metadata),
            Route("/jwks", jwks),
            Route("/token", token, methods=["POST"]),
        ])


@contextmanager
def running_issuer(**options: Any) -> Iterator[Issuer]:
    issuer = Issuer(**options)
    with serve_in_thread(issuer.app()) as url:
        issuer.url = url
        yield issuer


class HeaderRecorder:
    """ASGI middleware: writes down the headers and the body of every HTTP request, then passes it on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[dict[str, str]] = []
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.seen.append({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]})
        body = bytearray()
        self.bodies.append(b"")
        index = len(self.bodies) - 1

        async def recording() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                self.bodies[index] = bytes(body)
            return message

        await self.app(scope, recording, send)
