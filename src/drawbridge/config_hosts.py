"""The names ``/mcp`` answers to (``listen.allowed_hosts``): authorities, normalized to one spelling.

Invariant: one authority has one spelling here -- a name or IPv4 literal in lower case, an IPv6
literal in brackets in its compressed form, a port as a plain number (or ``*`` in a configured entry)
-- so that the check of a request's ``Host`` and ``Origin`` (``gateway.transports.http_hosts``) is a
comparison of strings, and a listener beyond loopback never starts without the list.
"""

from __future__ import annotations

import ipaddress
import re

from drawbridge.config_reader import Reader, str_list

_HOST_NAME_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")
_PORT_RE = re.compile(r"[0-9]{1,5}")


def split_authority(text: str) -> tuple[str, str | None] | None:
    """``host[:port]`` as (host, port text or None), or None when it is not one.

    The host comes back normalized, so that one authority has one spelling: a name or IPv4 literal in
    lower case, an IPv6 literal in brackets in its compressed form (a zone id is not an authority). The
    port text is returned unchecked: a configured entry may say ``*``, a request may not.
    """
    text = text.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        literal, rest = text[1:end], text[end + 1 :]
        if "%" in literal:
            return None
        try:
            host = f"[{ipaddress.IPv6Address(literal).compressed}]"
        except ValueError:
            return None
    else:
        literal, colon, port_text = text.partition(":")
        host, rest = literal, (colon + port_text)
        if not _HOST_NAME_RE.fullmatch(host):
            return None
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:]:
        return None
    return host, rest[1:]


def is_loopback_address(host: str) -> bool:
    """Whether a listen address is loopback: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def connectable_host(host: str) -> bool:
    """Whether ``host`` can be connected to by name: an IP address, or a name IDNA encodes and decodes
    again (no empty label, no label over 63 characters, no malformed ``xn--`` label). Checked when a
    URL is read, so that such a host is refused in one line rather than failing every connection (or
    ending in a traceback from the resolver's IDNA step)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return True
    try:
        host.encode("idna").decode("idna")
    except UnicodeError:
        return False
    return True


def allowed_hosts(listen: Reader) -> tuple[str, ...]:
    """``listen.allowed_hosts``, each entry checked and normalized (``HOST``, ``HOST:PORT`` or ``HOST:*``)."""
    entries = str_list(listen, "allowed_hosts")
    if not entries:
        raise listen.fail("allowed_hosts", "listen.allowed_hosts is empty: it would admit no request")
    out: list[str] = []
    for entry in entries:
        split = split_authority(entry)
        port = split[1] if split else None
        port_ok = port is None or port == "*" or (_PORT_RE.fullmatch(port) is not None and 0 < int(port) < 65536)
        if split is None or not port_ok:
            raise listen.fail(
                "allowed_hosts",
                f"listen.allowed_hosts: {entry!r} is not HOST, HOST:PORT or HOST:* (a host name or an IP "
                "address, an IPv6 address in brackets; no scheme, path or wildcard host)",
            )
        assert split is not None
        out.append(split[0] if port is None else f"{split[0]}:{port if port == '*' else int(port)}")
    return tuple(dict.fromkeys(out))


__all__ = ["allowed_hosts", "connectable_host", "is_loopback_address", "split_authority"]
