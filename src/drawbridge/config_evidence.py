"""The evidence sections of serve's configuration: ``checkpoints`` (signed trace checkpoints) and
``telemetry`` (live OTLP export).

Invariant: what loads here is in range and complete -- a checkpoint cadence that is positive, an
origin that is a C2SP key name, an OTLP endpoint that is an http(s) URL with a host and nothing
that could be a credential (no user name or password, no query, no fragment: the exporter appends
``/v1/traces`` to the URL and prints it in its own errors, so a token there would be sent to the
wrong path and land in logs), every header an HTTP token whose variable holds a valid header value
(its value is never read into the configuration, only checked: one with CR, LF or leading whitespace
would make the exporter print it, the credential, in its error at every export), and a service name
that names something. ``wrap``'s ``--otlp-header`` and ``--service-name`` are held to the same
checks (``telemetry_header_problem``, ``service_name_problem``). A refused endpoint, header value,
header name or variable name is never echoed (any of them may be the credential, written in place).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from drawbridge.config_headers import HEADER_NAME, HEADER_NAME_RULE, header_map, header_value_problem
from drawbridge.config_reader import Reader, env_name_problem, resolve_path

_ORIGIN_RE = re.compile(r"[!-*,-~]{1,255}")
"""A checkpoint origin: printable ASCII, no space, no '+' (a C2SP key name)."""


def checkpoints_section(top: Reader, base: Path) -> tuple[int, float, str | None, str | None]:
    """``checkpoints``: every how many lines and seconds, the keys directory and the origin."""
    every_lines, every_seconds, keys_dir, origin = 1000, 10.0, None, None
    if (checkpoints := top.child("checkpoints")) is not None:
        checkpoints.check_keys({"every_lines", "every_seconds", "keys_dir", "origin"})
        every_lines = checkpoints.get("every_lines", int, default=every_lines)
        every_seconds = checkpoints.get("every_seconds", float, default=every_seconds)
        if every_lines < 1:
            raise checkpoints.fail("every_lines", "checkpoints.every_lines must be at least 1")
        if not 0 < every_seconds < float("inf"):
            raise checkpoints.fail("every_seconds", "checkpoints.every_seconds must be positive and finite")
        keys_dir = resolve_path(base, checkpoints.get("keys_dir", str))
        origin = checkpoints.get("origin", str)
        if origin is not None and not _ORIGIN_RE.fullmatch(origin):
            raise checkpoints.fail(
                "origin", "checkpoints.origin must be printable ASCII without spaces or '+' (e.g. example.com/drawbridge/gw1)"
            )
    return every_lines, every_seconds, keys_dir, origin


def otlp_endpoint_problem(url: str) -> str | None:
    """Why ``url`` cannot be an OTLP endpoint, in words that never repeat it; None when it can.
    Credentials go in headers (``headers_env``, ``--otlp-header``), never in the URL."""
    from urllib.parse import urlsplit

    if not re.match(r"https?://[^/\s]+", url) or not url.isprintable() or " " in url:
        return "must be an http:// or https:// URL"
    try:
        parts = urlsplit(url)
        _port = parts.port
    except ValueError:
        return "is not a valid URL (its host or port does not parse)"
    if "@" in parts.netloc:
        return "must not hold a user name or password (send credentials as a header: headers_env)"
    if parts.query or url.split("#", 1)[0].endswith("?"):
        return "must not have a query (?...): the exporter appends its path after it; send credentials as a header"
    if "#" in url:
        return "must not have a fragment (#...)"
    if not parts.hostname:
        return "names no host"
    return None


def telemetry_header_problem(header: str, env_name: str, env: Mapping[str, str]) -> str | None:
    """Why the collector cannot be sent header ``header`` from variable ``env_name``; None when it can.
    Names the header and the variable, never the value (a credential), nor a name or variable name it
    refuses: either may be the credential, written in place (``Authorization: Bearer ...``)."""
    if not HEADER_NAME.fullmatch(header):
        return f"a telemetry header's name {HEADER_NAME_RULE}"
    subject = f"telemetry header {header}: the value given"
    if (problem := env_name_problem(env_name, subject, "the header's value")) is not None:
        return problem
    value = env.get(env_name)
    if not value:
        return f"telemetry header {header} needs environment variable {env_name}, which is missing or empty"
    problem = header_value_problem(header, env_name, value)
    return None if problem is None else f"telemetry {problem}"


def service_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be the telemetry's ``service.name`` (None: it can): an empty or blank name
    files every span under no service, and a control character breaks the log lines that show it."""
    if not name.strip():
        return "the telemetry's service name must not be empty"
    if not name.isprintable():
        return "the telemetry's service name must be printable (no control character)"
    return None


def telemetry_section(top: Reader, env: Mapping[str, str]) -> tuple[str | None, str, dict[str, str], str]:
    """``telemetry``: the OTLP endpoint (None: off), its protocol, header variables and service name."""
    otlp_endpoint, otlp_protocol, otlp_headers, service_name = None, "http/protobuf", {}, "drawbridge"
    if (telemetry := top.child("telemetry")) is not None:
        telemetry.check_keys({"endpoint", "protocol", "headers_env", "service_name"})
        otlp_endpoint = telemetry.get("endpoint", str, required=True)
        if (problem := otlp_endpoint_problem(otlp_endpoint)) is not None:
            raise telemetry.fail("endpoint", f"telemetry.endpoint {problem}")
        otlp_protocol = telemetry.get("protocol", str, default=otlp_protocol)
        if otlp_protocol not in ("http/protobuf", "grpc"):
            raise telemetry.fail("protocol", f"telemetry.protocol must be http/protobuf or grpc, not {otlp_protocol!r}")
        otlp_headers = header_map(telemetry, "headers_env")
        for header, env_name in otlp_headers.items():
            if (problem := telemetry_header_problem(header, env_name, env)) is not None:
                raise telemetry.fail("headers_env", problem)
        service_name = telemetry.get("service_name", str, default=service_name)
        if (problem := service_name_problem(service_name)) is not None:
            raise telemetry.fail("service_name", f"telemetry.service_name: {problem}")
    return otlp_endpoint, otlp_protocol, otlp_headers, service_name


__all__ = [
    "checkpoints_section", "otlp_endpoint_problem", "service_name_problem", "telemetry_header_problem",
    "telemetry_section",
]
