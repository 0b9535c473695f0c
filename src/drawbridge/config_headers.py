"""HTTP headers the configuration names (``headers_env``, an OpenAPI service's ``headers``): their
names, read from the file, and their values, read from the environment.

Invariant: a header the gateway sends on the configuration's behalf is one an HTTP client accepts. Its
name is an HTTP token (RFC 9110 section 5.6.2), checked when the file is read (``file:line``, a refused
name or variable name not repeated); its value
(a credential, never printed) is printable ASCII with inner spaces or tabs only, checked before
anything starts. Otherwise the client refuses the header at every connection attempt, and an upstream
would be retried forever for a reason no reconnect can mend.
"""

from __future__ import annotations

import re
from typing import Final

from drawbridge.config_reader import Reader, env_name_problem, str_map

HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP token: what a header's name may hold."""
_HEADER_VALUE: Final = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
"""Visible ASCII, spaces and tabs only between visible characters (no control character, no CR or LF)."""


HEADER_NAME_RULE: Final = (
    "is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only; no spaces or control characters)"
)
"""What a refused header name is told; the name is not repeated (``Name: value`` may hold the credential)."""


def header_map(reader: Reader, key: str) -> dict[str, str]:
    """``key`` as a map of HTTP header name to the environment variable that holds its value. Neither a
    refused name nor a refused variable name is repeated: either may be a credential written in place."""
    headers = str_map(reader, key)
    located = reader.child(key)
    for name, variable in headers.items():
        assert located is not None  # the map has this name
        if not HEADER_NAME.fullmatch(name):
            raise located.fail(name, f"{located.where}: a header's name {HEADER_NAME_RULE}")
        subject = f"{located.where}.{name}: the value given"
        if (problem := env_name_problem(variable, subject, "the header's value")) is not None:
            raise located.fail(name, problem)
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


__all__ = ["HEADER_NAME", "HEADER_NAME_RULE", "header_map", "header_value_problem"]
