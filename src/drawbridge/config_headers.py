"""HTTP headers the configuration names (``headers_env``, an OpenAPI service's ``headers``): their
names, read from the file, and their values, read from the environment.

Invariant: a header the gateway sends on the configuration's behalf is one an HTTP client accepts. Its
name is an HTTP token (RFC 9110 section 5.6.2), checked when the file is read (``file:line``); its value
(a credential, never printed) is printable ASCII with inner spaces or tabs only, checked before
anything starts. Otherwise the client refuses the header at every connection attempt, and an upstream
would be retried forever for a reason no reconnect can mend.
"""

from __future__ import annotations

import re
from typing import Final

from drawbridge.config_reader import ENV_NAME, Reader, str_map

HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token: what a header's name may hold."""
_HEADER_VALUE: Final = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
"""Visible ASCII, spaces and tabs only between visible characters (no control character, no CR or LF)."""


def header_map(reader: Reader, key: str) -> dict[str, str]:
    """``key`` as a map of HTTP header name to the environment variable that holds its value."""
    headers = str_map(reader, key, ENV_NAME)
    for name in headers:
        if not HEADER_NAME.fullmatch(name):
            located = reader.child(key)
            assert located is not None  # the map has this name
            raise located.fail(
                name,
                f"{reader.where}.{key}: {name!r} is not an HTTP header name "
                "(letters, digits and !#$%&'*+-.^_`|~ only; no spaces or control characters)",
            )
    return headers


def header_value_problem(header: str, env_name: str, value: str) -> str | None:
    """Why the value of ``env_name`` cannot be sent as header ``header`` (None: it can). The value is
    a credential: the answer names the variable and the header, never the value."""
    if _HEADER_VALUE.fullmatch(value):
        return None
    return (
        f"header {header} takes the value of environment variable {env_name}, which is not a valid header "
        "value (it holds a control character such as CR, LF or NUL, a non-ASCII character, or leading "
        "or trailing whitespace)"
    )


__all__ = ["HEADER_NAME", "header_map", "header_value_problem"]
