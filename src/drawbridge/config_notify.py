"""Approval notifications in serve's configuration (``approval.notify``): the webhooks a pending
approval is posted to, so that a person hears of it within seconds.

Invariant: a target that loads can be posted to and keeps its URL secret. The URL is never in the file:
it is read from the environment variable ``url_env`` names (a Slack, Teams or Mattermost webhook URL
carries its token), it is ``https://`` (``http://`` only to a loopback host: a test, a local relay),
and no message here repeats it, or any part of it: every problem names the variable instead. The
variables are credentials like any other the file names (``notify_env_names``): no child inherits
them. A command that posts nothing (``discover``, the offline policy commands) does not read them.
``wrap --notify-url-env`` holds its variables to the same rule (``url_env_problem``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from ruamel.yaml.comments import CommentedSeq

from drawbridge.config_hosts import connectable_host, is_loopback_address
from drawbridge.config_reader import Reader, env_name_problem, item_line

NOTIFY_FORMATS: Final = ("json", "slack")
"""``json``: one JSON object per event; ``slack``: ``{"text": ...}``, which Slack, Mattermost and
Teams' incoming webhooks (Slack-compatible) take."""
DEFAULT_TIMEOUT_SECONDS: Final = 5.0
MAX_TIMEOUT_SECONDS: Final = 60.0
MAX_TARGETS: Final = 16


@dataclass(frozen=True)
class NotifyTarget:
    """One webhook: named everywhere by its ``url_env``, never by its URL."""

    url_env: str
    url: str = field(repr=False)
    format: str = "json"
    console_url: str | None = None
    """The console as operators reach it (``scheme://host[:port][/prefix]``); a pending approval's
    link is this followed by ``/console/approvals/<id>``."""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS


def _postable(url: str) -> bool:
    """Whether a POST may go to ``url``: https with a host, or http to a loopback host; the host a name
    or an address that can be connected to, the port (when given) 1-65535; no user information (a
    password would travel in the clear in logs of proxies), no whitespace."""
    if not url.isprintable() or any(ch.isspace() for ch in url):
        return False
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if not host or not connectable_host(host) or port == 0:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback_address(host))


def url_env_problem(name: str, env: Mapping[str, str] | None, *, subject: str = "url_env") -> str | None:
    """Why the variable ``name`` does not name a webhook (``env`` None: only its name is checked), in
    words that name the variable and never repeat a value: not even ``name`` when it is not a
    variable's name, for it may be the URL itself, written where its variable's name goes (then the
    sentence is about ``subject``, the place the name was given)."""
    if (problem := env_name_problem(name, subject, "the URL")) is not None:
        return problem
    if env is None:
        return None
    url = env.get(name, "")
    if not url:
        return f"environment variable {name} is missing or empty"
    if not _postable(url):
        return (
            f"environment variable {name} must hold an https:// URL with a valid host name, a port (if any) "
            "from 1 to 65535 and no user or password (http:// only to a loopback host)"
        )
    return None


def _target(entry: Reader, env: Mapping[str, str], used: bool) -> NotifyTarget | None:
    entry.check_keys({"url_env", "format", "console_url", "timeout_seconds"})
    name = entry.get("url_env", str, required=True)
    if (problem := url_env_problem(name, None)) is not None:
        raise entry.fail("url_env", f"{entry.where}.{problem}")
    form = entry.get("format", str, default="json")
    if form not in NOTIFY_FORMATS:
        formats = ", ".join(NOTIFY_FORMATS)
        raise entry.fail("format", f"{entry.where}.format must be one of {formats}, not {form!r}")
    timeout = entry.get("timeout_seconds", float, default=DEFAULT_TIMEOUT_SECONDS)
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_SECONDS):
        raise entry.fail(
            "timeout_seconds",
            f"{entry.where}.timeout_seconds must be a number above 0 and at most {MAX_TIMEOUT_SECONDS:g}",
        )
    console = entry.get("console_url", str)
    if console is not None and (not _postable(console) or urlsplit(console)[3:] != ("", "")):
        raise entry.fail(
            "console_url",
            f"{entry.where}.console_url must be an https:// URL (http:// only to a loopback host) "
            "with no user, query or fragment",
        )
    if not used:
        return None
    if (problem := url_env_problem(name, env)) is not None:
        raise entry.fail("url_env", f"{entry.where}: {problem}")
    return NotifyTarget(name, env[name], form, console.rstrip("/") if console else None, timeout)


def notify_targets(
    approval: Reader, env: Mapping[str, str], *, used: bool = True
) -> tuple[NotifyTarget, ...]:
    """``approval.notify``: each target checked; ``used`` false checks the file alone (no variable read,
    no target returned), for a command that posts nothing."""
    entries = approval.get("notify", CommentedSeq, default=[])
    if len(entries) > MAX_TARGETS:
        raise approval.fail("notify", f"approval.notify lists {len(entries)} targets; at most {MAX_TARGETS}")
    targets: list[NotifyTarget] = []
    seen: set[str] = set()
    for index, node in enumerate(entries):
        entry = Reader(approval.file, node, f"approval.notify[{index}]", line=item_line(entries, index))
        target = _target(entry, env, used)
        name = entry.node["url_env"]
        if name in seen:
            raise entry.fail(
                "url_env", f"{entry.where}.url_env {name} is given twice (it names its target in logs)"
            )
        seen.add(name)
        if target is not None:
            targets.append(target)
    return tuple(targets)


def notify_env_names(top: Reader) -> frozenset[str]:
    """The variables ``approval.notify`` reads a webhook URL from, for a section already accepted."""
    approval = top.node.get("approval")
    entries = approval.get("notify") if isinstance(approval, Mapping) else None
    return frozenset(
        entry["url_env"] for entry in entries or ()
        if isinstance(entry, Mapping) and isinstance(entry.get("url_env"), str)
    )


__all__ = ["NOTIFY_FORMATS", "NotifyTarget", "notify_env_names", "notify_targets", "url_env_problem"]
