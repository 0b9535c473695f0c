"""The evidence sections of serve's configuration: ``checkpoints`` (signed trace checkpoints) and
``telemetry`` (live OTLP export).

Invariant: what loads here is in range and complete -- a checkpoint cadence that is positive, an
origin that is a C2SP key name, an OTLP endpoint that is an http(s) URL, and every header variable
the telemetry section names set (its value is never read into the configuration, only checked).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from drawbridge.config_headers import header_map, header_value_problem
from drawbridge.config_reader import Reader, resolve_path

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


def telemetry_section(top: Reader, env: Mapping[str, str]) -> tuple[str | None, str, dict[str, str], str]:
    """``telemetry``: the OTLP endpoint (None: off), its protocol, header variables and service name."""
    otlp_endpoint, otlp_protocol, otlp_headers, service_name = None, "http/protobuf", {}, "drawbridge"
    if (telemetry := top.child("telemetry")) is not None:
        telemetry.check_keys({"endpoint", "protocol", "headers_env", "service_name"})
        otlp_endpoint = telemetry.get("endpoint", str, required=True)
        if not re.match(r"https?://[^/\s]+", otlp_endpoint):
            raise telemetry.fail("endpoint", "telemetry.endpoint must be an http:// or https:// URL")
        otlp_protocol = telemetry.get("protocol", str, default=otlp_protocol)
        if otlp_protocol not in ("http/protobuf", "grpc"):
            raise telemetry.fail("protocol", f"telemetry.protocol must be http/protobuf or grpc, not {otlp_protocol!r}")
        otlp_headers = header_map(telemetry, "headers_env")
        for header, env_name in otlp_headers.items():
            if not env.get(env_name):
                raise telemetry.fail("headers_env", f"telemetry header {header} needs environment variable {env_name}, "
                                     "which is missing or empty")
            if (problem := header_value_problem(header, env_name, env[env_name])) is not None:
                raise telemetry.fail("headers_env", f"telemetry {problem}")
        service_name = telemetry.get("service_name", str, default=service_name)
    return otlp_endpoint, otlp_protocol, otlp_headers, service_name


__all__ = ["checkpoints_section", "telemetry_section"]
