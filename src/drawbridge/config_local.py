"""The configuration of upstreams the gateway runs itself: ``openapi:`` and ``cli_tools:`` entries.

Invariant: an entry that loads is one ``serve`` can open as written: exactly one spec source, URLs
that are http(s) with a host, a ``backend_url`` with no credentials, query or fragment (every tool's
description shows it; a refusal names the part, never its value), no address literal the SSRF guard would refuse unless the entry says
``allow_private: true`` (``private_address_problem``, the guard's own rule), CLI commands that are
one word each, flags that are flags, an ``env`` that ``exec`` can carry (``config_reader.env_map``),
timeouts that are positive durations no longer than the call timeout, and mesh7's exclusions (``bare``
with ``commands`` or ``strict``; ``strict`` without commands). Unknown keys are errors, as everywhere in
the configuration (``config_reader``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drawbridge.config_headers import header_map
from drawbridge.config_reader import ConfigError, Reader, named_entry, resolve_path, str_list, str_map, url_problem
from drawbridge.config_reader import env_map
from drawbridge.policy.globs import GlobError, compile_glob

_COMMAND_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_FLAG_RE = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
CLI_DEFAULT_TIMEOUT_SECONDS = 30.0
CLI_DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024
OPENAPI_DEFAULT_TIMEOUT_SECONDS = 30.0
OPENAPI_DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024
CLI_DEFAULT_ACTIONS = ("allow", "human_approval", "deny")


@dataclass(frozen=True)
class OpenApiConfig:
    """One OpenAPI service: its operations are served as ``<name>.<operation>``."""

    name: str
    file: str | None = None
    url: str | None = None
    backend_url: str | None = None
    """Where calls go; None: the spec's first server."""
    headers_env: Mapping[str, str] = field(default_factory=dict)  # header name -> env var holding its value
    timeout_seconds: float = OPENAPI_DEFAULT_TIMEOUT_SECONDS
    operations: tuple[str, ...] = ()
    """Globs over tool names (without the namespace); empty: every operation."""
    allow_private: bool = False
    """Allow the spec URL and the backend to be loopback, link-local or private addresses."""
    max_response_bytes: int = OPENAPI_DEFAULT_MAX_RESPONSE_BYTES


@dataclass(frozen=True)
class CliCommandConfig:
    """How one subcommand (or a bare binary) may be run."""

    allowed_args: tuple[str, ...] | None = None
    """Flags that may be passed (``--flag`` or ``--flag=value``); None: any flag."""
    timeout_seconds: float = CLI_DEFAULT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class CliToolConfig:
    """One CLI binary: declared subcommands as ``<name>.<command>``, ``<name>.run`` when ``bare``,
    and ``<name>.__dispatch`` unless ``strict``."""

    name: str
    bin: str
    commands: Mapping[str, CliCommandConfig] = field(default_factory=dict)
    bare: CliCommandConfig | None = None
    strict: bool = False
    default_action: str = "human_approval"
    """The dispatcher floor of ``<name>.__dispatch`` (never below ``human_approval``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    max_output_bytes: int = CLI_DEFAULT_MAX_OUTPUT_BYTES
    """The cap on each of stdout and stderr."""

    @property
    def dispatcher(self) -> bool:
        return not self.strict and self.bare is None


def private_address_problem(host: str) -> str | None:
    """Why a host is not a public address (loopback, link-local, private, reserved, multicast,
    unspecified, ``localhost``), or None: a public address, or a name to be resolved (the SSRF guard
    checks what it resolves to). Shared by the configuration and the guard."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return f"{address} is a loopback address"
    if address.is_link_local:
        return f"{address} is a link-local address"
    if address.is_unspecified:
        return f"{address} is the unspecified address"
    if address.is_multicast:
        return f"{address} is a multicast address"
    if address.is_private or not address.is_global:
        return f"{address} is a private or reserved address"
    return None


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a duration such as ``30s``, ``2m``, ``1m30s``, ``500ms``; None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    total, position = 0.0, 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != position:
            return None
        position = match.end()
        number, unit = float(match.group(1)), match.group(2)
        total += number * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    return total if position == len(value) else None


def _timeout(reader: Reader, key: str, default: float, limit: float) -> float:
    if key not in reader.node:
        return default
    if reader.node[key] is None:
        raise reader.null(key)
    seconds = parse_duration(reader.node[key])
    if seconds is None or not 0 < seconds < float("inf"):
        raise reader.fail(key, f"{reader.where}.{key} must be a positive number of seconds or a duration like 30s, 2m")
    if seconds > limit:
        raise reader.fail(
            key,
            f"{reader.where}.{key} ({seconds:g} s) is longer than limits.call_timeout_seconds ({limit:g} s), "
            "which would end the call first",
        )
    return seconds


ALLOW_PRIVATE_ADVICE = "set allow_private: true to allow it"
"""What a refusal by the SSRF guard advises for an ``openapi:`` entry (``discover --openapi`` says
its flag instead)."""


BACKEND_CREDENTIALS_ADVICE = (
    "credentials go in headers read from the environment (headers: {Authorization: ENV_VAR}), "
    "never in the URL, which every tool's description shows"
)


def backend_url_problem(url: str) -> str | None:
    """Why a URL cannot be an OpenAPI backend, naming the part but never its value: user:password@
    and a query would be shown in every tool's description (and a pinned trace), and a query or a
    fragment would drop the operation's path that the call appends. None when it can be one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # url_problem names it
    if "@" in parts.netloc:
        return f"holds credentials (user:password@); {BACKEND_CREDENTIALS_ADVICE}"
    if "?" in url:
        return f"has a query (?...); {BACKEND_CREDENTIALS_ADVICE}, and the operation's path is appended to the URL"
    if "#" in url:
        return "has a fragment (#...), which is never sent; the operation's path is appended to the URL"
    return None


def _http_url(reader: Reader, key: str, owner: str, allow_private: bool) -> str | None:
    url = reader.get(key, str)
    if url is None:
        return None
    if not re.match(r"https?://[^/?#]", url):
        raise reader.fail(key, f"{owner}: {key} must be an http:// or https:// URL with a host")
    if key == "backend_url" and (refused := backend_url_problem(url)) is not None:
        raise reader.fail(key, f"{owner}: {key} {refused}")
    if (invalid := url_problem(url)) is not None:
        raise reader.fail(key, f"{owner}: {key} {invalid}")
    from urllib.parse import urlsplit

    problem = private_address_problem(urlsplit(url).hostname or "")
    if problem is not None and not allow_private:
        raise reader.fail(
            key, f"{owner}: {key} is refused by the SSRF guard ({problem}); {ALLOW_PRIVATE_ADVICE}"
        )
    return url


def parse_openapi(
    file: str, node: Any, index: int, base: Path, call_timeout: float, line: int | None = None
) -> OpenApiConfig:
    reader, name = named_entry(
        file, node, "openapi", index,
        {"name", "file", "url", "backend_url", "headers", "timeout", "operations", "allow_private", "max_response_bytes"},
        line,
    )
    owner = f"openapi {name!r}"
    allow_private = bool(reader.get("allow_private", bool, default=False))
    spec_file, url = reader.get("file", str), _http_url(reader, "url", owner, allow_private)
    if (spec_file is None) == (url is None):
        raise reader.fail(None, f"{owner}: set file or url (the OpenAPI document), exactly one of them")
    operations = str_list(reader, "operations")
    for pattern in operations:
        try:
            compile_glob(pattern)
        except GlobError as exc:
            raise reader.fail("operations", f"{owner}: operations glob {pattern!r} is malformed ({exc})") from None
    max_bytes = reader.get("max_response_bytes", int, default=OPENAPI_DEFAULT_MAX_RESPONSE_BYTES)
    if max_bytes < 1024:
        raise reader.fail("max_response_bytes", f"{owner}: max_response_bytes must be at least 1024")
    return OpenApiConfig(
        name=name,
        file=resolve_path(base, spec_file),
        url=url,
        backend_url=_http_url(reader, "backend_url", owner, allow_private),
        headers_env=header_map(reader, "headers"),
        timeout_seconds=_timeout(reader, "timeout", min(OPENAPI_DEFAULT_TIMEOUT_SECONDS, call_timeout), call_timeout),
        operations=operations,
        allow_private=allow_private,
        max_response_bytes=max_bytes,
    )


def _cli_command(reader: Reader, owner: str, call_timeout: float) -> CliCommandConfig:
    reader.check_keys({"allowed_args", "timeout"})
    allowed = None
    if "allowed_args" in reader.node:
        allowed = str_list(reader, "allowed_args")  # refuses `allowed_args:` with no list: not "any flag"
        for flag in allowed:
            if not _FLAG_RE.fullmatch(flag):
                raise reader.fail(
                    "allowed_args", f"{owner}: allowed_args holds flags such as --verbose or -n, not {flag!r}"
                )
    default = min(CLI_DEFAULT_TIMEOUT_SECONDS, call_timeout)
    return CliCommandConfig(allowed_args=allowed, timeout_seconds=_timeout(reader, "timeout", default, call_timeout))


def parse_cli_tool(
    file: str, node: Any, index: int, base: Path, call_timeout: float, line: int | None = None
) -> CliToolConfig:
    reader, name = named_entry(
        file, node, "cli_tools", index,
        {"name", "bin", "commands", "bare", "strict", "default_action", "env", "working_dir", "max_output_bytes"},
        line,
    )
    owner = f"cli tool {name!r}"
    binary = reader.get("bin", str, required=True)
    if not binary or "\x00" in binary:
        raise reader.fail("bin", f"{owner}: bin must name a program")
    if "/" in binary:
        binary = resolve_path(base, binary) or binary  # a path: against the configuration's folder
    default_action = reader.get("default_action", str, default="human_approval") or "human_approval"
    if default_action not in CLI_DEFAULT_ACTIONS:
        raise reader.fail(
            "default_action", f"{owner}: default_action must be one of {', '.join(CLI_DEFAULT_ACTIONS)}, not {default_action!r}"
        )
    commands: dict[str, CliCommandConfig] = {}
    if (section := reader.child("commands")) is not None:
        for command, body in section.node.items():
            if not isinstance(command, str) or not _COMMAND_RE.fullmatch(command):
                raise section.fail(
                    command if isinstance(command, str) else None,
                    f"{owner}: command {command!r} must be one word of [A-Za-z0-9_-] (it is passed as one argument)",
                )
            if command == "run" or command.startswith("__"):
                raise section.fail(command, f"{owner}: command name {command!r} is reserved")
            if body is None:
                commands[command] = CliCommandConfig(timeout_seconds=min(CLI_DEFAULT_TIMEOUT_SECONDS, call_timeout))
                continue
            commands[command] = _cli_command(
                Reader(file, body, f"{section.where}.{command}"), f"{owner}, command {command!r}", call_timeout
            )
    bare = None
    if (bare_reader := reader.child("bare")) is not None:  # ``bare: {}`` for the defaults; ``bare:`` is refused
        bare = _cli_command(bare_reader, f"{owner}, bare", call_timeout)
    strict = bool(reader.get("strict", bool, default=False))
    if bare is not None and commands:
        raise reader.fail("bare", f"{owner}: bare runs the binary without subcommands; it excludes commands")
    if bare is not None and strict:
        raise reader.fail("strict", f"{owner}: bare and strict exclude each other (a bare binary has no dispatcher)")
    if strict and not commands:
        raise reader.fail("strict", f"{owner}: strict needs at least one command (it registers no dispatcher)")
    max_output = reader.get("max_output_bytes", int, default=CLI_DEFAULT_MAX_OUTPUT_BYTES)
    if max_output < 64:
        raise reader.fail("max_output_bytes", f"{owner}: max_output_bytes must be at least 64")
    return CliToolConfig(
        name=name,
        bin=binary,
        commands=commands,
        bare=bare,
        strict=strict,
        default_action=default_action,
        env=env_map(reader, "env"),
        working_dir=resolve_path(base, reader.get("working_dir", str)),
        max_output_bytes=max_output,
    )


__all__ = [
    "ALLOW_PRIVATE_ADVICE",
    "CLI_DEFAULT_ACTIONS",
    "CLI_DEFAULT_MAX_OUTPUT_BYTES",
    "CLI_DEFAULT_TIMEOUT_SECONDS",
    "OPENAPI_DEFAULT_MAX_RESPONSE_BYTES",
    "OPENAPI_DEFAULT_TIMEOUT_SECONDS",
    "CliCommandConfig",
    "CliToolConfig",
    "ConfigError",
    "OpenApiConfig",
    "parse_cli_tool",
    "parse_duration",
    "backend_url_problem",
    "parse_openapi",
    "private_address_problem",
]
