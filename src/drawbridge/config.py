"""The gateway configuration file (``drawbridge.yaml``), validated in one place.

Invariant: a configuration that loads is complete and consistent. Every key is
known (an unknown key is an error naming file, line and key), every value has
the right type and range, and nothing secret is stored in the file itself:
bearer tokens are given either as the SHA-256 of the token (``token_sha256``)
or as the name of an environment variable that holds it (``token_env``).

Theory of operation: the YAML is parsed with ruamel's round-trip loader, which
keeps line numbers; a small table of field specs per section drives validation,
so the accepted keys are readable in one place and the error messages are
uniform. Relative paths are resolved against the config file's directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
UPSTREAM_PROTOCOLS: tuple[str, ...] = ("2025-11-25", "2026-07-28")
"""The eras the gateway speaks to an upstream; the first is the default."""
_AGENT_RE = re.compile(r"[A-Za-z0-9._:@/-]+")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEX64 = re.compile(r"[0-9a-f]{64}")
FSYNC_MODES = ("always", "batch", "never")
_ORIGIN_RE = re.compile(r"[!-*,-~]{1,255}")
"""A checkpoint origin: printable ASCII, no space, no '+' (a C2SP key name)."""


class ConfigError(ValueError):
    """A configuration problem, located as ``file:line: problem``."""

    def __init__(self, file: str, line: int | None, problem: str) -> None:
        self.file, self.line, self.problem = file, line, problem
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {problem}")


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
    evidence_dir: str = "./evidence"
    state_path: str = "./drawbridge.db"
    fsync: str = "batch"
    listen_host: str = "127.0.0.1"
    listen_port: int = 8787
    admin_token_sha256: str | None = None
    agents: tuple[AgentToken, ...] = ()
    anonymous_agent: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    max_depth: int = 64
    """How deep an agent's message may nest arrays and objects (``limits.max_depth``)."""
    call_timeout_seconds: float = 120.0
    tool_decision_truth_out: str | None = None
    pin_tools: bool = False
    hide_denied_tools: bool = False
    approval_timeout_seconds: float = 300.0
    approval_non_blocking: bool = False
    approval_elicitation: bool = True
    approval_memory_enabled: bool = True
    approval_memory_min_approvals: int = 3
    approval_memory_count_client_answers: bool = True
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


def _line(node: Any, key: Any = None) -> int | None:
    try:
        if key is not None and isinstance(node, CommentedMap):
            return int(node.lc.key(key)[0]) + 1
        return int(node.lc.line) + 1
    except Exception:  # noqa: BLE001 -- plain values carry no position
        return None


class _Reader:
    """Typed field access on a mapping node that remembers what was read."""

    def __init__(self, file: str, node: Any, where: str) -> None:
        if not isinstance(node, CommentedMap):
            raise ConfigError(file, _line(node), f"{where} must be a mapping")
        self.file, self.node, self.where = file, node, where

    def fail(self, key: str | None, problem: str) -> ConfigError:
        return ConfigError(self.file, _line(self.node, key) if key else _line(self.node), problem)

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.node:
            if not isinstance(key, str) or key not in allowed:
                raise self.fail(
                    key if isinstance(key, str) else None,
                    f"unknown key {key!r} in {self.where} (allowed: {', '.join(sorted(allowed))})",
                )

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False) -> Any:
        if key not in self.node or self.node[key] is None:
            if required:
                raise self.fail(None, f"{self.where}: missing required key {key!r}")
            return default
        value = self.node[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind in (int, float):
            raise self.fail(key, f"{self.where}.{key} must be a number, not a boolean")
        if not isinstance(value, kind):
            name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise self.fail(key, f"{self.where}.{key} must be {name}")
        return value

    def child(self, key: str) -> _Reader | None:
        if key not in self.node or self.node[key] is None:
            return None
        return _Reader(self.file, self.node[key], f"{self.where}.{key}" if self.where != "config" else key)


def _str_list(reader: _Reader, key: str) -> tuple[str, ...]:
    value = reader.get(key, CommentedSeq, default=[])
    if not all(isinstance(item, str) for item in value):
        raise reader.fail(key, f"{reader.where}.{key} must be a list of strings")
    return tuple(value)


def _str_map(reader: _Reader, key: str, value_re: re.Pattern[str] | None = None) -> dict[str, str]:
    sub = reader.child(key)
    if sub is None:
        return {}
    out: dict[str, str] = {}
    for name, value in sub.node.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise sub.fail(name if isinstance(name, str) else None, f"{sub.where} must map strings to strings")
        if value_re is not None and not value_re.fullmatch(value):
            raise sub.fail(name, f"{sub.where}.{name}: {value!r} is not an environment variable name")
        out[name] = value
    return out


def _resolve(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base / path))


def _token_digest(
    reader: _Reader, env: Mapping[str, str], what: str
) -> str | None:
    """The SHA-256 of a token given as ``token_sha256`` or ``token_env``; never the token itself."""
    digest = reader.get("token_sha256", str)
    env_name = reader.get("token_env", str)
    if digest is not None and env_name is not None:
        raise reader.fail("token_env", f"{what}: give token_sha256 or token_env, not both")
    if digest is not None:
        if not _HEX64.fullmatch(digest):
            raise reader.fail("token_sha256", f"{what}: token_sha256 must be 64 lowercase hex characters")
        return digest
    if env_name is not None:
        if not _ENV_RE.fullmatch(env_name):
            raise reader.fail("token_env", f"{what}: {env_name!r} is not an environment variable name")
        token = env.get(env_name, "")
        if not token:
            raise reader.fail("token_env", f"{what}: environment variable {env_name} is missing or empty")
        return hashlib.sha256(token.encode()).hexdigest()
    return None


def _upstream(file: str, node: Any, index: int, base: Path) -> UpstreamConfig:
    reader = _Reader(file, node, f"upstreams[{index}]")
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
            env=_str_map(reader, "env"),
            cwd=_resolve(base, reader.get("cwd", str)),
            protocol=protocol,
        )
    if transport == "streamable_http":
        url = reader.get("url", str, required=True)
        if not re.match(r"https?://", url):
            raise reader.fail("url", f"upstream {name!r}: url must start with http:// or https://")
        if reader.get("command", str) is not None:
            raise reader.fail("command", f"upstream {name!r}: a streamable_http upstream takes url, not command")
        return UpstreamConfig(
            name=name, transport=transport, url=url, headers_env=_str_map(reader, "headers_env", _ENV_RE),
            protocol=protocol,
        )
    raise reader.fail("transport", f"upstream {name!r}: unknown transport {transport!r} (stdio or streamable_http)")


_TOP_KEYS = {
    "upstreams", "policy_dir", "policy_file", "evidence_dir", "state_path", "fsync", "listen", "auth",
    "limits", "tool_decision_truth", "pin_tools", "hide_denied_tools", "approval", "checkpoints", "telemetry",
}


def parse_config(text: str, source_file: str, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate a configuration text; ``env`` supplies environment variables named by the file."""
    env = os.environ if env is None else env
    base = Path(source_file).resolve().parent
    try:
        root = YAML(typ="rt").load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(source_file, mark.line + 1 if mark else None, f"invalid YAML: {exc}") from None
    if root is None:
        raise ConfigError(source_file, None, "the configuration is empty")
    top = _Reader(source_file, root, "config")
    top.check_keys(_TOP_KEYS)

    raw_upstreams = top.get("upstreams", CommentedSeq, required=True)
    upstreams = tuple(_upstream(source_file, node, i, base) for i, node in enumerate(raw_upstreams))
    if not upstreams:
        raise top.fail("upstreams", "upstreams must list at least one server")
    seen: set[str] = set()
    for upstream in upstreams:
        if upstream.name in seen:
            raise top.fail("upstreams", f"duplicate upstream name {upstream.name!r}")
        seen.add(upstream.name)

    policy_dir, policy_file = top.get("policy_dir", str), top.get("policy_file", str)
    if policy_dir is None and policy_file is None:
        raise top.fail(None, "set policy_dir (native policies) or policy_file: without a policy every call is refused")
    if policy_dir is not None and policy_file is not None:
        raise top.fail("policy_file", "set policy_dir or policy_file, not both")

    fsync = top.get("fsync", str, default="batch")
    if fsync not in FSYNC_MODES:
        raise top.fail("fsync", f"fsync must be one of {', '.join(FSYNC_MODES)}, not {fsync!r}")

    host, port = "127.0.0.1", 8787
    if (listen := top.child("listen")) is not None:
        listen.check_keys({"host", "port"})
        host = listen.get("host", str, default=host)
        port = listen.get("port", int, default=port)
        if not 0 <= port <= 65535:
            raise listen.fail("port", f"listen.port {port} is out of range")

    admin_digest, agents, anonymous = None, [], None
    if (auth := top.child("auth")) is not None:
        auth.check_keys({"admin", "agents", "anonymous_agent"})
        if (admin := auth.child("admin")) is not None:
            admin.check_keys({"token_sha256", "token_env"})
            admin_digest = _token_digest(admin, env, "auth.admin")
        for i, node in enumerate(auth.get("agents", CommentedSeq, default=[])):
            entry = _Reader(source_file, node, f"auth.agents[{i}]")
            entry.check_keys({"agent", "token_sha256", "token_env"})
            agent = entry.get("agent", str, required=True)
            if not _AGENT_RE.fullmatch(agent):
                raise entry.fail("agent", f"auth.agents[{i}].agent {agent!r} has characters outside [A-Za-z0-9._:@/-]")
            digest = _token_digest(entry, env, f"auth.agents[{i}]")
            if digest is None:
                raise entry.fail(None, f"auth.agents[{i}]: give token_sha256 or token_env")
            agents.append(AgentToken(agent=agent, token_sha256=digest))
        if len({a.token_sha256 for a in agents}) != len(agents):
            raise auth.fail("agents", "two agents share one bearer token")
        anonymous = auth.get("anonymous_agent", str)

    max_bytes, timeout, max_depth = 4 * 1024 * 1024, 120.0, 64
    if (limits := top.child("limits")) is not None:
        limits.check_keys({"max_message_bytes", "call_timeout_seconds", "max_depth"})
        max_bytes = limits.get("max_message_bytes", int, default=max_bytes)
        timeout = limits.get("call_timeout_seconds", float, default=timeout)
        max_depth = limits.get("max_depth", int, default=max_depth)
        if max_bytes < 1024:
            raise limits.fail("max_message_bytes", "limits.max_message_bytes must be at least 1024")
        if not 2 <= max_depth <= 512:
            raise limits.fail("max_depth", "limits.max_depth must be from 2 to 512")
        if timeout <= 0:
            raise limits.fail("call_timeout_seconds", "limits.call_timeout_seconds must be positive")

    tdt_out = None
    if (tdt := top.child("tool_decision_truth")) is not None:
        tdt.check_keys({"out"})
        tdt_out = _resolve(base, tdt.get("out", str, required=True))

    approval_timeout = 300.0
    non_blocking, elicitation = False, True
    memory_enabled, memory_min, memory_client = True, 3, True
    if (approval := top.child("approval")) is not None:
        approval.check_keys({"timeout_seconds", "non_blocking", "elicitation", "memory"})
        approval_timeout = approval.get("timeout_seconds", float, default=approval_timeout)
        if not approval_timeout > 0 or approval_timeout == float("inf"):
            raise approval.fail("timeout_seconds", "approval.timeout_seconds must be positive and finite")
        non_blocking = approval.get("non_blocking", bool, default=False)
        elicitation = approval.get("elicitation", bool, default=True)
        if (memory := approval.child("memory")) is not None:
            memory.check_keys({"enabled", "min_approvals", "count_client_answers"})
            memory_enabled = memory.get("enabled", bool, default=True)
            memory_min = memory.get("min_approvals", int, default=3)
            if isinstance(memory_min, bool) or memory_min < 1:
                raise memory.fail(
                    "min_approvals", "approval.memory.min_approvals must be an integer of at least 1"
                )
            memory_client = memory.get("count_client_answers", bool, default=True)

    every_lines, every_seconds, keys_dir, origin = 1000, 10.0, None, None
    if (checkpoints := top.child("checkpoints")) is not None:
        checkpoints.check_keys({"every_lines", "every_seconds", "keys_dir", "origin"})
        every_lines = checkpoints.get("every_lines", int, default=every_lines)
        every_seconds = checkpoints.get("every_seconds", float, default=every_seconds)
        if every_lines < 1:
            raise checkpoints.fail("every_lines", "checkpoints.every_lines must be at least 1")
        if not 0 < every_seconds < float("inf"):
            raise checkpoints.fail("every_seconds", "checkpoints.every_seconds must be positive and finite")
        keys_dir = _resolve(base, checkpoints.get("keys_dir", str))
        origin = checkpoints.get("origin", str)
        if origin is not None and not _ORIGIN_RE.fullmatch(origin):
            raise checkpoints.fail(
                "origin", "checkpoints.origin must be printable ASCII without spaces or '+' (e.g. example.com/drawbridge/gw1)"
            )

    otlp_endpoint, otlp_protocol, otlp_headers, service_name = None, "http/protobuf", {}, "drawbridge"
    if (telemetry := top.child("telemetry")) is not None:
        telemetry.check_keys({"endpoint", "protocol", "headers_env", "service_name"})
        otlp_endpoint = telemetry.get("endpoint", str, required=True)
        if not re.match(r"https?://[^/\s]+", otlp_endpoint):
            raise telemetry.fail("endpoint", "telemetry.endpoint must be an http:// or https:// URL")
        otlp_protocol = telemetry.get("protocol", str, default=otlp_protocol)
        if otlp_protocol not in ("http/protobuf", "grpc"):
            raise telemetry.fail("protocol", f"telemetry.protocol must be http/protobuf or grpc, not {otlp_protocol!r}")
        otlp_headers = _str_map(telemetry, "headers_env", _ENV_RE)
        for header, env_name in otlp_headers.items():
            if not env.get(env_name):
                raise telemetry.fail("headers_env", f"telemetry header {header} needs environment variable {env_name}, "
                                     "which is missing or empty")
        service_name = telemetry.get("service_name", str, default=service_name)

    return GatewayConfig(
        source_file=str(Path(source_file).resolve()),
        upstreams=upstreams,
        policy_dir=_resolve(base, policy_dir),
        policy_file=_resolve(base, policy_file),
        evidence_dir=_resolve(base, top.get("evidence_dir", str, default="./evidence")) or "",
        state_path=_resolve(base, top.get("state_path", str, default="./drawbridge.db")) or "",
        fsync=fsync,
        listen_host=host,
        listen_port=port,
        admin_token_sha256=admin_digest,
        agents=tuple(agents),
        anonymous_agent=anonymous,
        max_message_bytes=max_bytes,
        max_depth=max_depth,
        call_timeout_seconds=timeout,
        tool_decision_truth_out=tdt_out,
        pin_tools=bool(top.get("pin_tools", bool, default=False)),
        hide_denied_tools=bool(top.get("hide_denied_tools", bool, default=False)),
        approval_timeout_seconds=approval_timeout,
        approval_non_blocking=non_blocking,
        approval_elicitation=elicitation,
        approval_memory_enabled=memory_enabled,
        approval_memory_min_approvals=memory_min,
        approval_memory_count_client_answers=memory_client,
        checkpoint_every_lines=every_lines,
        checkpoint_every_seconds=every_seconds,
        keys_dir=keys_dir,
        origin=origin,
        telemetry_endpoint=otlp_endpoint,
        telemetry_protocol=otlp_protocol,
        telemetry_headers_env=otlp_headers,
        telemetry_service_name=service_name,
    )


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate a configuration file; unreadable files are a ConfigError too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, f"cannot read the configuration: {exc.__class__.__name__}: {exc}") from None
    return parse_config(text, str(path), env)

