"""``auth.oauth``: ``/mcp`` as an OAuth 2.1 resource server, validated in one place.

Invariant: an OAuth section that loads names at least one authorization server by its exact issuer
identifier, fetched over https (plain http only on a loopback host, for a local issuer), a resource URI that
is an absolute http(s) URL without query or fragment (RFC 8707: the audience every token must carry), a
claim that names the agent, and scope globs already compiled. No URL it holds (issuer, ``jwks_uri``,
resource) carries a user name, a password, a query or a fragment, so none can hold a secret that a log line
showing it would leak; a URL refused is never repeated in the error. Nothing secret is in it: the gateway
holds no client secret, only the issuers' public keys, which it fetches.

Theory of operation. The section is read after ``auth.agents`` (static bearer tokens stay, and both may be
on at once, but then only through the ``agents`` table, so that an issuer's subject cannot share a static
agent's id by its name alone); ``auth.anonymous_agent`` is refused beside it, because a request without a
token must get the 401 challenge that starts an MCP client's OAuth flow, not an anonymous session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from drawbridge.config_hosts import connectable_host, is_loopback_address
from drawbridge.config_reader import AGENT_ID, Reader, item_line, str_list
from drawbridge.policy.globs import Glob, GlobError, compile_glob

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""The asymmetric JWS algorithms a token may be signed with; HMAC and ``none`` never (the gateway holds
no shared secret, and an issuer's public key must not double as one)."""
DEFAULT_ALGORITHMS = ("RS256", "ES256")
_SCOPE_RE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 scope-token


@dataclass(frozen=True)
class IssuerConfig:
    """One authorization server: its issuer identifier, and where its keys are (None: from its
    RFC 8414 metadata)."""

    issuer: str
    jwks_uri: str | None = None


@dataclass(frozen=True)
class OAuthConfig:
    issuers: tuple[IssuerConfig, ...]
    resource: str | None = None
    """This resource's URI (the audience); None: the ``/mcp`` URL of the bound listener."""
    agent_claim: str = "sub"
    agent_map: Mapping[str, str] | None = None
    """Claim value -> agent id; when given, a value it does not list is refused."""
    scopes: tuple[str, ...] = ()
    """Scopes every request needs."""
    tool_scopes: tuple[tuple[str, tuple[Glob, ...]], ...] = ()
    """(scope, tool globs): a ``tools/call`` of a matching tool needs the scope."""
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway_seconds: float = 30.0
    jwks_cache_seconds: float = 300.0
    jwks_min_refresh_seconds: float = 30.0
    """At most one fetch of an issuer's keys this often because of an unknown ``kid``."""

    @property
    def scopes_supported(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.scopes, *(scope for scope, _ in self.tool_scopes)]))

    def scopes_for_tool(self, tool: str) -> tuple[str, ...]:
        """The scopes a call of ``tool`` needs beyond ``scopes``."""
        return tuple(scope for scope, globs in self.tool_scopes if any(g.matches(tool) for g in globs))


def transport_problem(text: str, what: str) -> str | None:
    """Why ``text`` may not be fetched: not an absolute https URL with a host that can be connected to
    (plain http on a loopback host only), or None. The rule for every URL keys are fetched from, the
    configured ones and those an issuer's metadata names (``oauth_keys``): a key set fetched in the
    clear from another host could be swapped on the way. The words never repeat the URL."""
    if not text.isprintable() or any(ch.isspace() for ch in text):
        return f"{what} is not a URL (it holds a space or a control character)"
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        _port = parts.port
    except ValueError:
        return f"{what} is not a URL (its host or port does not parse)"
    if parts.scheme not in ("https", "http") or not host:
        return f"{what} must be an absolute https URL"
    if not connectable_host(host):
        return f"{what} is not a URL (its host is not a name that can be connected to)"
    if parts.scheme == "http" and not is_loopback_address(host):
        return f"{what} uses plain http on a host that is not loopback: use https"
    return None


def _checked_url(text: str, what: str) -> str | None:
    """Why ``text`` is not an acceptable configured URL (``transport_problem``; no user name, password,
    query or fragment), or None. The words name the place and never repeat the URL: a user name, a
    password or a query key in it may be a secret."""
    if problem := transport_problem(text, what):
        return problem
    parts = urlsplit(text)
    if "@" in parts.netloc:
        return f"{what} must not hold a user name or password"
    if parts.query or "?" in text:
        return f"{what} must not have a query (?...)"
    if "#" in text:
        return f"{what} must not have a fragment (#...)"
    return None


def oauth_section(
    auth: Reader, anonymous_agent: str | None, listen_host: str, static_agents: bool = False
) -> OAuthConfig | None:
    """``auth.oauth``, checked; None when absent. Beyond a loopback listener the resource URI must be
    given: the address a socket is bound to is not the URL agents reach it by. Beside static agents
    (``static_agents``) the ``agents`` table is required: without it a token's claim value is the agent
    id, and an issuer's subject named like a static agent would act as that agent."""
    section = auth.child("oauth")
    if section is None:
        return None
    section.check_keys({
        "resource", "authorization_servers", "agent_claim", "agents", "scopes", "tool_scopes", "algorithms",
        "leeway_seconds", "jwks_cache_seconds", "jwks_min_refresh_seconds",
    })
    if anonymous_agent is not None:
        raise auth.fail(
            "anonymous_agent",
            "auth.anonymous_agent cannot be used with auth.oauth: a request without a token must be "
            "challenged (401) so that the client signs in",
        )
    issuers: list[IssuerConfig] = []
    servers = section.get("authorization_servers", list, required=True)
    for i, node in enumerate(servers):
        where = f"auth.oauth.authorization_servers[{i}]"
        entry = Reader(section.file, node, where, line=item_line(servers, i))
        entry.check_keys({"issuer", "jwks_uri"})
        issuer = entry.get("issuer", str, required=True)
        jwks_uri = entry.get("jwks_uri", str)
        for key, value in (("issuer", issuer), ("jwks_uri", jwks_uri)):
            if value is not None and (problem := _checked_url(value, f"{entry.where}.{key}")):
                raise entry.fail(key, problem)
        issuers.append(IssuerConfig(issuer, jwks_uri))
    if not issuers:
        raise section.fail("authorization_servers", "auth.oauth.authorization_servers is empty: no token could be checked")
    if len({i.issuer for i in issuers}) != len(issuers):
        raise section.fail("authorization_servers", "auth.oauth.authorization_servers names one issuer twice")
    resource = section.get("resource", str)
    if resource is not None and (problem := _checked_url(resource, "auth.oauth.resource")):
        raise section.fail("resource", problem)
    if resource is None and not is_loopback_address(listen_host):
        raise section.fail(
            None, "auth.oauth.resource is required when listen.host is not loopback: give the https URL agents use for /mcp"
        )
    claim = section.get("agent_claim", str, default="sub")
    if not claim.strip():
        raise section.fail(
            "agent_claim", "auth.oauth.agent_claim is empty: name the token claim that names the agent"
        )
    agent_map: dict[str, str] | None = None
    if (table := section.child("agents")) is None and static_agents:
        raise section.fail(
            None,
            "auth.oauth.agents is required beside auth.agents: map the claim values to agent ids, so that no "
            "token's claim value can take a static agent's id",
        )
    if table is not None:
        if not table.node:
            raise section.fail("agents", "auth.oauth.agents is empty: no token could name an agent")
        agent_map = {}
        for value, agent in table.node.items():
            if not isinstance(value, str) or not isinstance(agent, str) or not AGENT_ID.fullmatch(agent):
                raise table.fail(
                    value if isinstance(value, str) else None,
                    "auth.oauth.agents maps claim values to agent ids of the characters [A-Za-z0-9._:@/-]",
                )
            agent_map[value] = agent
    scopes = str_list(section, "scopes")
    tool_scopes: list[tuple[str, tuple[Glob, ...]]] = []
    if (table := section.child("tool_scopes")) is not None:
        for scope in table.node:
            if not isinstance(scope, str) or not _SCOPE_RE.fullmatch(scope):
                raise table.fail(scope if isinstance(scope, str) else None, f"auth.oauth.tool_scopes: {scope!r} is not a scope")
            try:
                globs = tuple(compile_glob(g) for g in str_list(table, scope))
            except GlobError as exc:
                raise table.fail(scope, f"auth.oauth.tool_scopes.{scope}: {exc}") from None
            tool_scopes.append((scope, globs))
    for scope in scopes:
        if not _SCOPE_RE.fullmatch(scope):
            raise section.fail("scopes", f"auth.oauth.scopes: {scope!r} is not a scope")
    algorithms = str_list(section, "algorithms") if "algorithms" in section.node else DEFAULT_ALGORITHMS
    if not algorithms:
        raise section.fail(
            "algorithms", "auth.oauth.algorithms is empty: no token could be checked (omit it for RS256 and ES256)"
        )
    if unknown := [a for a in algorithms if a not in ALGORITHMS]:
        raise section.fail("algorithms", f"auth.oauth.algorithms: {', '.join(unknown)} not among {', '.join(ALGORITHMS)}")
    numbers: dict[str, float] = {}
    for key, default in (("leeway_seconds", 30.0), ("jwks_cache_seconds", 300.0), ("jwks_min_refresh_seconds", 30.0)):
        numbers[key] = section.get(key, float, default=default)
        if not 0 <= numbers[key] <= 86400:
            raise section.fail(key, f"auth.oauth.{key} must be from 0 to 86400")
    return OAuthConfig(
        issuers=tuple(issuers),
        resource=resource,
        agent_claim=claim,
        agent_map=agent_map,
        scopes=scopes,
        tool_scopes=tuple(tool_scopes),
        algorithms=tuple(algorithms),
        **numbers,
    )


__all__ = ["ALGORITHMS", "IssuerConfig", "OAuthConfig", "oauth_section", "transport_problem"]
