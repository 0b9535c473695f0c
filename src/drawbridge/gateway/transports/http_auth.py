"""Who signs in at ``/mcp``: static bearer tokens, and OAuth 2.1 access tokens (JWTs) as a resource server.

Invariant: a request is an agent's only through a static token whose digest is configured
(``http_identity.identify``) or a JWT that PyJWT verified against a key of its issuer's key set, with
``iss`` one of the configured issuers, ``aud`` naming this resource (RFC 8707), ``exp`` in the future
and ``nbf`` in the past (within ``leeway_seconds``), signed with a configured asymmetric algorithm, and
the agent claim mapped to an agent id. Every refusal is a 401 whose ``WWW-Authenticate`` names the
protected-resource metadata (RFC 9728) when OAuth is on, or a 403 ``insufficient_scope`` naming the
scopes missing. The token itself is never logged, echoed or forwarded: the upstreams get the
credentials configured for them, never the agent's (the spec forbids token passthrough).

Theory of operation. ``authenticate`` tries the static tokens first (a digest comparison), then the
JWT. A verified JWT is remembered by its SHA-256 until it expires (or the key set changes), so the
per-call cost of a token seen before is a hash and a dict lookup; only a ``kid`` the key set does not
hold awaits a fetch (``oauth_keys``). A refused credential is logged at WARNING with the reason and
the peer address, never the token (a request with none at all under OAuth, at INFO). PyJWT and the key store (with its HTTP client) are imported only
when OAuth is configured: a gateway of static tokens never holds them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from drawbridge.activity_log import login_refused
from drawbridge.config_oauth import OAuthConfig
from drawbridge.gateway.protocol.jsonrpc import Kind, Message
from drawbridge.gateway.protocol.methods import TOOLS_CALL
from drawbridge.gateway.transports.http_identity import AUTH_REQUIRED, HttpSettings, bearer_digest, identify

if TYPE_CHECKING:
    from drawbridge.gateway.transports.oauth_keys import KeyStore

logger = logging.getLogger("drawbridge.gateway.http")

PRM_PATH: Final = "/.well-known/oauth-protected-resource"
VERIFIED_CACHE_SIZE: Final = 4096
_AGENT_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/-")


@dataclass(frozen=True)
class Identity:
    agent: str
    credential: str
    """What proved the agent: ``token:<sha256>`` of a static token, ``anonymous``, or ``oauth:<issuer>
    <claim value>`` of a JWT (the same subject whatever token it holds now). A ``/mcp`` session is
    bound to it, so one credential never reaches a session another one opened, agent id alike or not."""
    scopes: frozenset[str] | None = None
    """The token's scopes; None for a static token (which holds every scope)."""
    expires: float | None = None


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    challenge: str


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def metadata_url(resource: str) -> str:
    """The RFC 9728 metadata URL of a resource: the well-known path, then the resource's path."""
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, PRM_PATH + path, "", ""))


class Authenticator:
    """The credential check of ``/mcp``, and the metadata that tells clients how to get a credential."""

    def __init__(self, settings: HttpSettings, oauth: OAuthConfig | None, resource: str | None) -> None:
        self.settings = settings
        self.oauth = oauth
        self.resource = resource
        self.keys: KeyStore | None = None
        if oauth is not None:
            from drawbridge.gateway.transports.oauth_keys import KeyStore

            self.keys = KeyStore(oauth)
        self._verified: OrderedDict[str, tuple[Identity, int]] = OrderedDict()
        self._metadata_url = metadata_url(resource) if resource is not None else None

    # -- the challenge and the metadata

    def challenge(self, error: str | None = None, description: str | None = None, scope: str | None = None) -> str:
        if self._metadata_url is None:
            return "Bearer"
        params = []
        if error is not None:
            params.append(f"error={_quoted(error)}")
        if description is not None:
            params.append(f"error_description={_quoted(description)}")
        if scope is not None:
            params.append(f"scope={_quoted(scope)}")
        params.append(f"resource_metadata={_quoted(self._metadata_url)}")
        return "Bearer " + ", ".join(params)

    def metadata(self) -> dict[str, Any]:
        """The protected-resource metadata document (RFC 9728 2)."""
        assert self.oauth is not None and self.resource is not None
        document: dict[str, Any] = {
            "resource": self.resource,
            "authorization_servers": [i.issuer for i in self.oauth.issuers],
            "bearer_methods_supported": ["header"],
            "resource_name": "drawbridge",
        }
        if supported := self.oauth.scopes_supported:
            document["scopes_supported"] = list(supported)
        return document

    def routes(self) -> list[BaseRoute]:
        """The metadata at the well-known path, in its root and its path-suffixed form (RFC 9728 3.1)."""
        if self.oauth is None or self.resource is None:
            return []

        async def serve(_request: Request) -> Response:
            return JSONResponse(self.metadata(), headers={"cache-control": "max-age=300"})

        paths = dict.fromkeys([PRM_PATH, urlsplit(self._metadata_url or "").path])
        return [Route(path, serve, methods=["GET"]) for path in paths]

    # -- the check

    def refuse(
        self, peer: str, reason: str, error: str | None = "invalid_token", problem: str = "invalid_token"
    ) -> Refusal:
        """A 401, and its ``login_refused`` activity line: at WARNING for every refusal, except a request
        with no credential under OAuth, at INFO (how every OAuth client starts, to be told where to
        sign in; docs/configuration.md, ``auth.oauth``). The line says what was wrong, never the token."""
        level = logging.INFO if error is None and self.oauth is not None else logging.WARNING
        login_refused("mcp", problem, peer, level=level, reason=reason)
        if self.oauth is None:
            return Refusal(401, AUTH_REQUIRED, "Bearer")
        message = "authentication refused: " + reason if error else AUTH_REQUIRED
        return Refusal(401, message, self.challenge(error, reason if error else None))

    async def authenticate(self, authorization: str | None, peer: str) -> Identity | Refusal:
        """The identity the one ``Authorization`` value proves, or why not."""
        agent = identify(authorization, self.settings)
        if agent is not None:
            digest = bearer_digest(authorization) if authorization is not None else None
            return Identity(agent, f"token:{digest}" if digest is not None else "anonymous")
        if authorization is None:
            return self.refuse(peer, "no credential presented", error=None, problem="missing")
        if not authorization.strip():
            return self.refuse(peer, "the Authorization header is empty", problem="not_bearer")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self.refuse(peer, "the Authorization header is not a bearer token", problem="not_bearer")
        if self.oauth is None or self.keys is None:
            return self.refuse(peer, "the bearer token matches no agent", problem="unknown_token")
        identity = await self._verify(token, peer)
        if isinstance(identity, Identity) and (missing := [s for s in self.oauth.scopes if s not in (identity.scopes or ())]):
            return self.insufficient(peer, identity.agent, missing)
        return identity

    def insufficient(self, peer: str, agent: str, missing: list[str]) -> Refusal:
        logger.warning("request of agent %s refused at /mcp from %s: scope %s missing", agent, peer, " ".join(missing))
        scope = " ".join(missing)
        message = f"insufficient scope: this request needs the scope {scope}"
        return Refusal(403, message, self.challenge("insufficient_scope", message, scope))

    def check_message(self, identity: Identity, message: Message, peer: str) -> Refusal | None:
        """A 403 when the message is a ``tools/call`` of a tool whose scope (``tool_scopes``) the
        token lacks; the policy decides the call only after this."""
        if self.oauth is None or identity.scopes is None or not self.oauth.tool_scopes:
            return None
        params = message.body.get("params") if message.kind is Kind.REQUEST and message.method == TOOLS_CALL else None
        tool = params.get("name") if isinstance(params, Mapping) else None
        if not isinstance(tool, str):
            return None
        missing = [s for s in self.oauth.scopes_for_tool(tool) if s not in identity.scopes]
        return self.insufficient(peer, identity.agent, missing) if missing else None

    async def _verify(self, token: str, peer: str) -> Identity | Refusal:
        import jwt  # loaded with the KeyStore: only OAuth reaches here

        from drawbridge.gateway.transports.oauth_keys import KeysUnavailable

        assert self.oauth is not None and self.keys is not None
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        cached = self._verified.get(digest)
        if cached is not None:
            identity, generation = cached
            if generation == self.keys.generation and identity.expires is not None and time.time() < identity.expires:
                return identity
            del self._verified[digest]
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return self.refuse(peer, "the bearer token is neither a configured token nor a JWT")
        algorithm = header.get("alg")
        if algorithm not in self.oauth.algorithms:
            return self.refuse(peer, "the token is signed with an algorithm this resource does not accept")
        issuer = unverified.get("iss")
        if not isinstance(issuer, str) or issuer not in self.keys.issuers:
            return self.refuse(peer, "the token comes from an issuer this resource does not trust")
        kid = header.get("kid")
        try:
            key = await self.keys.key(issuer, kid if isinstance(kid, str) else None)
        except KeysUnavailable as exc:
            logger.warning("the signing keys of issuer %s could not be fetched: %s", issuer, exc)
            return Refusal(503, "service unavailable: the issuer's signing keys could not be fetched", "Bearer")
        if key is None:
            return self.refuse(peer, "the token is signed with a key its issuer does not publish")
        generation = self.keys.generation
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=[algorithm],
                audience=self.resource,
                issuer=issuer,
                leeway=self.oauth.leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            return self.refuse(peer, "the token has expired")
        except jwt.ImmatureSignatureError:
            return self.refuse(peer, "the token is not valid yet")
        except jwt.InvalidAudienceError:
            return self.refuse(peer, "the token was issued for another resource")
        except jwt.PyJWTError as exc:
            return self.refuse(peer, f"the token is invalid ({type(exc).__name__})")
        agent = self._agent(claims)
        if agent is None:
            return self.refuse(peer, f"the token's {self.oauth.agent_claim} claim names no agent of this gateway")
        credential = f"oauth:{issuer} {claims[self.oauth.agent_claim]}"
        expires = float(claims["exp"]) + self.oauth.leeway_seconds
        identity = Identity(agent, credential, _scopes(claims), expires)
        self._verified[digest] = (identity, generation)
        if len(self._verified) > VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)
        return identity

    def _agent(self, claims: Mapping[str, Any]) -> str | None:
        assert self.oauth is not None
        value = claims.get(self.oauth.agent_claim)
        if not isinstance(value, str) or not value:
            return None
        if self.oauth.agent_map is not None:
            return self.oauth.agent_map.get(value)
        return value if len(value) <= 256 and set(value) <= _AGENT_CHARS else None


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """``scope`` (RFC 9068: space-separated), or ``scp``, which issuers send either as a list or, as
    Entra ID does, space-separated like ``scope``."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, str):
        return frozenset(scp.split())
    if isinstance(scp, list):
        return frozenset(s for s in scp if isinstance(s, str))
    return frozenset()


def resource_for(oauth: OAuthConfig | None, mcp_url: str) -> str | None:
    """The resource URI: the configured one, else the URL ``/mcp`` is served at."""
    if oauth is None:
        return None
    return oauth.resource or mcp_url


__all__ = ["PRM_PATH", "Authenticator", "Identity", "Refusal", "metadata_url", "resource_for"]
