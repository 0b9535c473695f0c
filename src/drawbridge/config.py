"""The gateway configuration file (``drawbridge.yaml``), validated in one place.

Invariant: a configuration that loads is complete and consistent. Every key is
known (an unknown key is an error naming file, line and key), every value has
the right type and range, and nothing secret is stored in the file itself:
bearer tokens are given either as the SHA-256 of the token (``token_sha256``)
or as the name of an environment variable that holds it (``token_env``).

Theory of operation: the YAML is read by ``policy.strict_yaml`` (ruamel's round-trip
loader, which keeps line numbers; the same strict reading as policy files: no duplicate key, no
custom tag, plain JSON values, bounded depth and alias expansion); a small table of field specs per
section drives validation, so the accepted keys are readable in one place and the error messages
are uniform. Relative paths are resolved against the config file's directory.

Three kinds of upstream share one namespace (their ``name`` prefixes tool names, so
it is unique across all three): MCP servers (``upstreams``), OpenAPI services
(``openapi``) and CLI binaries (``cli_tools``). What can be checked without I/O is
checked here (an address literal that is private without ``allow_private``, a CLI
timeout longer than the call timeout); what needs the network or the file system
(a spec, a binary on PATH) is checked when ``serve`` or ``discover`` starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedSeq

from drawbridge.config_local import (
    ALLOW_PRIVATE_ADVICE,
    CliCommandConfig,
    CliToolConfig,
    OpenApiConfig,
    parse_cli_tool,
    parse_openapi,
    private_address_problem,
)
from drawbridge.config_evidence import checkpoints_section, telemetry_section
from drawbridge.config_headers import header_map
from drawbridge.config_limits import (
    BODY_READ_SECONDS,
    CALL_TIMEOUT_SECONDS,
    HEADER_READ_SECONDS,
    MAX_CONNECTIONS,
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    MAX_SESSIONS,
    MAX_SESSIONS_PER_AGENT,
    limits_section,
)
from drawbridge.config_guards import ResultGuardRule, result_guards_section
from drawbridge.config_rates import RateLimits, rate_limits_section
from drawbridge.config_state import SharedState, state_env_names, state_file, state_section
from drawbridge.config_hosts import allowed_hosts as _allowed_hosts
from drawbridge.config_hosts import is_loopback_address, split_authority
from drawbridge.config_approval import approval_section
from drawbridge.config_notify import NotifyTarget, notify_env_names
from drawbridge.config_oauth import OAuthConfig, oauth_section
from drawbridge.config_secrets import (
    USES_ALL,
    shared_token,
    shared_token_problem,
    token_digest,
    token_env_names,
)
from drawbridge.config_reader import AGENT_ID, AGENT_ID_CHARS, ConfigError, env_map, item_line, url_problem
from drawbridge.config_reader import Reader as _Reader
from drawbridge.config_reader import resolve_path as _resolve
from drawbridge.config_reader import str_list as _str_list
from drawbridge.policy.strict_yaml import YamlProblem, read_yaml

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
UPSTREAM_PROTOCOLS: tuple[str, ...] = ("2025-11-25", "2026-07-28")
"""The eras the gateway speaks to an upstream; the first is the default."""
FSYNC_MODES = ("always", "batch", "never")


@dataclass(frozen=True)
class UpstreamConfig:
    """One upstream MCP server: a stdio child or a streamable-HTTP URL."""

    name: str
    transport: str  # "stdio" | "streamable_http"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers_env: Mapping[str, str] = field(default_factory=dict)  # header name -> env var holding its value
    protocol: str = "2025-11-25"
    """The era the gateway speaks to it: "2025-11-25" (initialize handshake) or "2026-07-28"
    (``server/discover`` and a per-request envelope)."""


@dataclass(frozen=True)
class AgentToken:
    """A bearer token mapped to an agent id; only the token's SHA-256 is held."""

    agent: str
    token_sha256: str


@dataclass(frozen=True)
class GatewayConfig:
    source_file: str
    upstreams: tuple[UpstreamConfig, ...]
    policy_dir: str | None = None
    policy_file: str | None = None
    shadow_policy_dir: str | None = None
    """A policy set decided beside the enforced one and only reported (``shadow_policy_file``: one file)."""
    shadow_policy_file: str | None = None
    evidence_dir: str = "./evidence"
    state_path: str = "./drawbridge.db"
    fsync: str = "batch"
    listen_host: str = "127.0.0.1"
    listen_port: int = 8787
    control_host: str = "127.0.0.1"
    control_port: int = 8788
    """The control plane's own listener, apart from ``/mcp`` (``control``)."""
    control_configured: bool = False
    """The file has a ``control`` section (with ``--stdio``, only then is a control plane served)."""
    allowed_hosts: tuple[str, ...] | None = None
    """The ``Host`` (and ``Origin``) authorities ``/mcp`` answers to, normalized (``listen.allowed_hosts``);
    None: the loopback names with the listening port, which only a loopback listener may use."""
    admin_token_sha256: str | None = None
    agents: tuple[AgentToken, ...] = ()
    anonymous_agent: str | None = None
    oauth: OAuthConfig | None = None
    """``/mcp`` as an OAuth 2.1 resource server (``auth.oauth``); None: static tokens only."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_depth: int = MAX_DEPTH
    """How deep an agent's message may nest arrays and objects (``limits.max_depth``)."""
    max_sessions_per_agent: int = MAX_SESSIONS_PER_AGENT
    max_sessions: int = MAX_SESSIONS
    header_read_seconds: float = HEADER_READ_SECONDS
    """How long a peer of a listener (``/mcp``, the control plane) may take to send a request's headers."""
    body_read_seconds: float = BODY_READ_SECONDS
    """How long it may take to send the body its headers announce."""
    max_connections: int = MAX_CONNECTIONS
    """How many connections each listener holds at once."""
    call_timeout_seconds: float = CALL_TIMEOUT_SECONDS
    tool_decision_truth_out: str | None = None
    pin_tools: bool = False
    pin_prompts: bool = False
    hide_denied_tools: bool = False
    approval_timeout_seconds: float = 300.0
    approval_non_blocking: bool = False
    approval_elicitation: bool = True
    approval_ask_by_link: bool = False
    approval_memory_enabled: bool = False
    """Approval memory is off unless ``approval.memory`` is configured (then on, unless ``enabled: false``)."""
    approval_memory_min_approvals: int = 3
    approval_memory_count_client_answers: bool = False
    approval_notify: tuple[NotifyTarget, ...] = ()
    """The webhooks a pending approval is posted to (``approval.notify``; the URLs read from the environment)."""
    openapi: tuple[OpenApiConfig, ...] = ()
    cli_tools: tuple[CliToolConfig, ...] = ()
    checkpoint_every_lines: int = 1000
    checkpoint_every_seconds: float = 10.0
    keys_dir: str | None = None
    """Where the signing keys live; None: ``keys`` inside ``evidence_dir``."""
    origin: str | None = None
    telemetry_endpoint: str | None = None
    """OTLP endpoint of live telemetry (None: off)."""
    telemetry_protocol: str = "http/protobuf"
    telemetry_headers_env: Mapping[str, str] = field(default_factory=dict)
    telemetry_service_name: str = "drawbridge"
    shared_state: SharedState | None = None
    """State on PostgreSQL shared by replicas (``state``, ``replica``); None: the SQLite ``state_path``."""
    rate_limits: RateLimits | None = None
    result_guards: tuple[ResultGuardRule, ...] | None = None
    """``result_guards``: None when absent (results pass as they come)."""
    credential_env: frozenset[str] = frozenset()
    """Every variable the file reads a credential from (tokens, headers, state URL, key rings): never a
    child's unless a stdio upstream's own ``env`` sets it (``runtime.settings.secret_env_names``)."""

    @property
    def upstream_names(self) -> tuple[str, ...]:
        """Every upstream of the three kinds, in configuration order (MCP, OpenAPI, CLI)."""
        return tuple(u.name for u in (*self.upstreams, *self.openapi, *self.cli_tools))


def _upstream(file: str, node: Any, index: int, base: Path, line: int | None = None) -> UpstreamConfig:
    reader = _Reader(file, node, f"upstreams[{index}]", line=line)
    reader.check_keys(
        {"name", "transport", "command", "args", "env", "cwd", "url", "headers_env", "protocol"}
    )
    name = reader.get("name", str, required=True)
    if not _NAME_RE.fullmatch(name):
        raise reader.fail("name", f"upstreams[{index}].name {name!r} must match [A-Za-z0-9_-]+ (it prefixes tool names)")
    protocol = reader.get("protocol", str) or UPSTREAM_PROTOCOLS[0]
    if protocol not in UPSTREAM_PROTOCOLS:
        raise reader.fail(
            "protocol",
            f"upstream {name!r}: protocol {protocol!r} is not one the gateway speaks to upstreams "
            "(2025-11-25: initialize handshake; 2026-07-28: per-request envelope)",
        )
    transport = reader.get("transport", str, required=True)
    if transport == "stdio":
        command = reader.get("command", str, required=True)
        if reader.get("url", str) is not None:
            raise reader.fail("url", f"upstream {name!r}: a stdio upstream takes command, not url")
        return UpstreamConfig(
            name=name,
            transport=transport,
            command=command,
            args=_str_list(reader, "args"),
            env=env_map(reader, "env"),
            cwd=_resolve(base, reader.get("cwd", str)),
            protocol=protocol,
        )
    if transport == "streamable_http":
        url = reader.get("url", str, required=True)
        if not re.match(r"https?://", url):
            raise reader.fail("url", f"upstream {name!r}: url must start with http:// or https://")
        if (problem := url_problem(url)) is not None:
            raise reader.fail("url", f"upstream {name!r}: url {problem}")
        if reader.get("command", str) is not None:
            raise reader.fail("command", f"upstream {name!r}: a streamable_http upstream takes url, not command")
        return UpstreamConfig(
            name=name, transport=transport, url=url, headers_env=header_map(reader, "headers_env"),
            protocol=protocol,
        )
    raise reader.fail("transport", f"upstream {name!r}: unknown transport {transport!r} (stdio or streamable_http)")


def _agent_id(reader: _Reader, key: str, *, required: bool = False) -> str | None:
    """An agent id the file names (a token's agent, the anonymous agent): one rule for every agent id,
    which the logs, the trace and the policies' ``agent`` patterns all carry."""
    agent = reader.get(key, str, required=required)
    if agent is not None and not AGENT_ID.fullmatch(agent):
        raise reader.fail(key, f"{reader.where}.{key} {agent!r} has characters outside {AGENT_ID_CHARS}")
    return agent


_TOP_KEYS = {
    "upstreams", "policy_dir", "policy_file", "shadow_policy_dir", "shadow_policy_file", "evidence_dir",
    "state_path", "fsync", "listen", "control", "auth", "limits", "tool_decision_truth", "pin_tools",
    "pin_prompts", "hide_denied_tools", "approval", "openapi", "cli_tools", "checkpoints", "telemetry", "state",
    "replica", "rate_limits", "result_guards",
}


def _top(text: str, source_file: str) -> _Reader:
    """The top-level mapping of a configuration text, its keys checked."""
    try:
        root = read_yaml(text)
    except YamlProblem as exc:
        raise ConfigError(source_file, exc.line, exc.problem) from None
    if root is None:
        raise ConfigError(source_file, None, "the configuration is empty")
    top = _Reader(source_file, root, "config")
    top.check_keys(_TOP_KEYS)
    return top


def _policy_keys(top: _Reader, prefix: str) -> tuple[str | None, str | None]:
    """``{prefix}policy_dir`` and ``{prefix}policy_file``, at most one set (the enforced one, the shadow)."""
    policy_dir, policy_file = top.get(f"{prefix}policy_dir", str), top.get(f"{prefix}policy_file", str)
    if policy_dir is not None and policy_file is not None:
        raise top.fail(f"{prefix}policy_file", f"set {prefix}policy_dir or {prefix}policy_file, not both")
    return policy_dir, policy_file


def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, f"cannot read the configuration: {exc.__class__.__name__}: {exc}") from None


def parse_config(
    text: str, source_file: str, env: Mapping[str, str] | None = None, *, uses: frozenset[str] = USES_ALL
) -> GatewayConfig:
    """Validate a configuration text; ``env`` supplies environment variables named by the file. ``uses``
    names the secrets the command uses (``admin``, ``agents``): a token variable of another is not
    required (``discover`` uses none, ``serve --stdio`` no agent token)."""
    env = os.environ if env is None else env
    base = Path(source_file).resolve().parent
    top = _top(text, source_file)

    raw_upstreams = top.get("upstreams", CommentedSeq, default=[])
    upstreams = tuple(
        _upstream(source_file, node, i, base, item_line(raw_upstreams, i))
        for i, node in enumerate(raw_upstreams)
    )

    policy_dir, policy_file = _policy_keys(top, "")
    if policy_dir is None and policy_file is None:
        raise top.fail(None, "set policy_dir (native policies) or policy_file: without a policy every call is refused")
    shadow_dir, shadow_file = _policy_keys(top, "shadow_")

    fsync = top.get("fsync", str, default="batch")
    if fsync not in FSYNC_MODES:
        raise top.fail("fsync", f"fsync must be one of {', '.join(FSYNC_MODES)}, not {fsync!r}")

    host, port, allowed_hosts = "127.0.0.1", 8787, None
    if (listen := top.child("listen")) is not None:
        listen.check_keys({"host", "port", "allowed_hosts"})
        host = listen.get("host", str, default=host)
        port = listen.get("port", int, default=port)
        if not 0 <= port <= 65535:
            raise listen.fail("port", f"listen.port {port} is out of range")
        if listen.get("allowed_hosts", object) is not None:
            allowed_hosts = _allowed_hosts(listen)
        elif not is_loopback_address(host):
            raise listen.fail(
                "host",
                f"listen.host {host} is not a loopback address: list in listen.allowed_hosts the names "
                "agents reach the gateway by (their Host header), so that a DNS-rebinding web page cannot",
            )

    control_host, control_port = "127.0.0.1", 8788
    control = top.child("control")
    if control is not None:
        control.check_keys({"host", "port"})
        control_host = control.get("host", str, default=control_host)
        control_port = control.get("port", int, default=control_port)
        if not 0 <= control_port <= 65535:
            raise control.fail("port", f"control.port {control_port} is out of range")
        if control_port and (control_host, control_port) == (host, port):
            raise control.fail(
                "port", "the control plane listens apart from /mcp: give control.port a port of its own"
            )

    admin_digest, agents, anonymous, oauth = None, [], None, None
    if (auth := top.child("auth")) is not None:
        auth.check_keys({"admin", "agents", "anonymous_agent", "oauth"})
        holders: list[tuple[str, str, _Reader]] = []  # (use, digest, where): no two uses hold one token
        if (admin := auth.child("admin")) is not None:
            admin.check_keys({"token_sha256", "token_env"})
            admin_digest = token_digest(admin, env, "auth.admin", "admin" in uses) or None
            if admin_digest is not None:
                holders.append(("auth.admin (the control plane)", admin_digest, admin))
        seq = auth.get("agents", CommentedSeq, default=[])
        for i, node in enumerate(seq):
            entry = _Reader(source_file, node, f"auth.agents[{i}]", line=item_line(seq, i))
            entry.check_keys({"agent", "token_sha256", "token_env"})
            agent = _agent_id(entry, "agent", required=True)
            digest = token_digest(entry, env, f"auth.agents[{i}]", "agents" in uses)
            if digest is None:
                raise entry.fail(None, f"auth.agents[{i}]: give token_sha256 or token_env")
            if not digest:
                continue  # a command that serves no agent over HTTP does not need its token
            agents.append(AgentToken(agent=agent, token_sha256=digest))
            holders.append((f"auth.agents[{i}] (agent {agent})", digest, entry))
        if (shared := shared_token(holders)) is not None:
            (first, _, _), (second, _, reader) = shared
            raise reader.fail(None, shared_token_problem(first, second))
        anonymous = _agent_id(auth, "anonymous_agent")
        static_agents = bool(auth.get("agents", CommentedSeq, default=[]))
        oauth = oauth_section(auth, anonymous, host, static_agents=static_agents)

    limits = limits_section(top)
    timeout = float(limits.get("call_timeout_seconds", CALL_TIMEOUT_SECONDS))

    raw_openapi = top.get("openapi", CommentedSeq, default=[])
    openapi = tuple(
        parse_openapi(source_file, node, i, base, timeout, item_line(raw_openapi, i))
        for i, node in enumerate(raw_openapi)
    )
    raw_cli_tools = top.get("cli_tools", CommentedSeq, default=[])
    cli_tools = tuple(
        parse_cli_tool(source_file, node, i, base, timeout, item_line(raw_cli_tools, i))
        for i, node in enumerate(raw_cli_tools)
    )
    if not (upstreams or openapi or cli_tools):
        raise top.fail(
            "upstreams" if "upstreams" in top.node else None,
            "list at least one upstream: an MCP server (upstreams), an OpenAPI service (openapi) or a CLI tool (cli_tools)",
        )
    seen: set[str] = set()
    for key, entries in (("upstreams", upstreams), ("openapi", openapi), ("cli_tools", cli_tools)):
        for entry in entries:
            if entry.name in seen:
                raise top.fail(key, f"duplicate upstream name {entry.name!r} (names are unique across upstreams, openapi and cli_tools)")
            seen.add(entry.name)

    tdt_out = None
    if (tdt := top.child("tool_decision_truth")) is not None:
        tdt.check_keys({"out"})
        tdt_out = _resolve(base, tdt.get("out", str, required=True))

    approval = approval_section(top, env, notify_used="notify" in uses)

    every_lines, every_seconds, keys_dir, origin = checkpoints_section(top, base)
    otlp_endpoint, otlp_protocol, otlp_headers, service_name = telemetry_section(top, env)
    shared_state = state_section(top, env)
    headers = [entry.headers_env for entry in (*upstreams, *openapi)] + [otlp_headers]

    return GatewayConfig(
        source_file=str(Path(source_file).resolve()),
        upstreams=upstreams,
        policy_dir=_resolve(base, policy_dir),
        policy_file=_resolve(base, policy_file),
        shadow_policy_dir=_resolve(base, shadow_dir),
        shadow_policy_file=_resolve(base, shadow_file),
        evidence_dir=_resolve(base, top.get("evidence_dir", str, default="./evidence")) or "",
        state_path=_resolve(base, state_file(top)) or "",
        fsync=fsync,
        listen_host=host,
        listen_port=port,
        control_host=control_host,
        control_port=control_port,
        control_configured=control is not None,
        allowed_hosts=allowed_hosts,
        admin_token_sha256=admin_digest,
        agents=tuple(agents),
        anonymous_agent=anonymous,
        oauth=oauth,
        **limits,  # type: ignore[arg-type]
        tool_decision_truth_out=tdt_out,
        pin_tools=bool(top.get("pin_tools", bool, default=False)),
        pin_prompts=bool(top.get("pin_prompts", bool, default=False)),
        hide_denied_tools=bool(top.get("hide_denied_tools", bool, default=False)),
        **approval,
        openapi=openapi,
        cli_tools=cli_tools,
        checkpoint_every_lines=every_lines,
        checkpoint_every_seconds=every_seconds,
        keys_dir=keys_dir,
        origin=origin,
        telemetry_endpoint=otlp_endpoint,
        telemetry_protocol=otlp_protocol,
        telemetry_headers_env=otlp_headers,
        telemetry_service_name=service_name,
        shared_state=shared_state,
        rate_limits=rate_limits_section(top),
        result_guards=result_guards_section(top),
        credential_env=token_env_names(top) | state_env_names(top) | notify_env_names(top)
        | {n for h in headers for n in h.values()},
    )


@dataclass(frozen=True)
class ControlAccess:
    """How the CLI reaches the control plane of the gateway a configuration file describes."""

    url: str
    state_path: str
    """The state file; the gateway's own admin token lives beside it (``<stem>.admin-token``)."""
    token_env: str | None
    """The environment variable ``auth.admin.token_env`` names, if any."""
    token_configured: bool
    """``auth.admin`` is configured: the gateway makes no token file."""


def control_access(path: str | os.PathLike[str]) -> ControlAccess:
    """What the CLI needs of a configuration file, read without the secrets the gateway needs (the
    CLI asks only for what it uses); the file is held to the same key rules for what is read."""
    source = str(path)
    top = _top(_read(path), source)
    base = Path(source).resolve().parent
    host, port = "127.0.0.1", 8788
    if (control := top.child("control")) is not None:
        control.check_keys({"host", "port"})
        host = control.get("host", str, default=host)
        port = control.get("port", int, default=port)
    token_env, configured = None, False
    if (auth := top.child("auth")) is not None and (admin := auth.child("admin")) is not None:
        configured = True
        token_env = admin.get("token_env", str)
    shown = f"[{host}]" if ":" in host else host
    return ControlAccess(
        url=f"http://{shown}:{port}",
        state_path=_resolve(base, state_file(top)) or "",
        token_env=token_env,
        token_configured=configured,
    )


def load_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None, *, uses: frozenset[str] = USES_ALL
) -> GatewayConfig:
    """Read and validate a configuration file; unreadable files are a ConfigError too."""
    return parse_config(_read(path), str(path), env, uses=uses)


__all__ = [
    "ALLOW_PRIVATE_ADVICE",
    "USES_ALL",
    "FSYNC_MODES",
    "UPSTREAM_PROTOCOLS",
    "AgentToken",
    "CliCommandConfig",
    "CliToolConfig",
    "ConfigError",
    "GatewayConfig",
    "OpenApiConfig",
    "UpstreamConfig",
    "load_config",
    "parse_config",
    "private_address_problem",
]
