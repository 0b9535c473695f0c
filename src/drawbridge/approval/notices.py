"""What an approval notification says (``approval.notify``): the body of the POST to a webhook.

Invariant: a notice carries the facts an operator needs to find the approval -- its id, agent, tool,
deciding rule, reason, expiry, a link to its console page -- and never an argument value, a digest of
one, or a token. Every text that came from an agent or an upstream (agent id, tool name, reason) is
cleaned first: no character that could split, hide or reorder a line (``UNSAFE_CATEGORIES``), and a
bounded length. The ``slack`` text is escaped as Slack requires (``&``, ``<``, ``>``), so a tool named
``<!channel>`` or ``<@U123>`` is shown, not turned into a mention or a link; the only link in it is
the console's, which the configuration gives.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical.text import UNSAFE_CATEGORIES

PENDING: Final = "approval_pending"
_LIMITS: Final = {"agent": 128, "tool": 256, "rule": 512, "reason": 500}


@dataclass(frozen=True)
class PendingNotice:
    """The facts of one pending approval, as given (``clean`` is applied when a body is made)."""

    approval_id: str
    agent: str
    tool: str
    rule: str
    reason: str
    expires_at: str
    console: str | None = None
    """The approval's console page; None when no console is configured or served."""


def rule_named(policy: str | None, rule_index: int | None, source_file: str | None) -> str:
    """The rule that asked, as the CLI and the console name it: ``policy #index (file)``, the index
    marked as one so it is never read as a line number; for a call the gateway itself held (a changed
    pin), that no rule did."""
    if rule_index is None:
        return f"none: held by the gateway ({policy or 'no policy'})"
    return f"{policy} #{rule_index} ({source_file})"


def clean(text: str, limit: int) -> str:
    """``text`` on one line: each character of ``UNSAFE_CATEGORIES`` (control, format, separators) made
    U+FFFD, and cut to ``limit`` characters with an ellipsis."""
    if not text.isprintable():
        text = "".join("\ufffd" if unicodedata.category(ch) in UNSAFE_CATEGORIES else ch for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def slack_escape(text: str) -> str:
    """Slack's escaping of message text: ``&``, ``<`` and ``>`` as entities (so no ``<...>`` link,
    mention or special command can be written by whoever named an agent or a tool)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _facts(notice: PendingNotice) -> dict[str, str]:
    facts = {key: clean(getattr(notice, key), limit) for key, limit in _LIMITS.items()}
    return {"approval_id": clean(notice.approval_id, 64), **facts, "expires_at": clean(notice.expires_at, 64)}


def json_body(notice: PendingNotice) -> dict[str, Any]:
    """``format: json``: one object, ``event`` first; ``console`` only when there is a page to link."""
    body: dict[str, Any] = {"event": PENDING, **_facts(notice)}
    if notice.console is not None:
        body["console"] = notice.console
    return body


def slack_body(notice: PendingNotice) -> dict[str, Any]:
    """``format: slack``: ``{"text": ...}``, the same facts in one readable line, then the link."""
    facts = {key: slack_escape(value) for key, value in _facts(notice).items()}
    text = (
        f"drawbridge: approval {facts['approval_id'][:8]} pending: agent {facts['agent']} asks to run "
        f"{facts['tool']} (rule {facts['rule']}: {facts['reason']}); expires {facts['expires_at']}"
    )
    if notice.console is not None:
        text += f" <{slack_escape(notice.console)}|Open in the console>"
    return {"text": text}


def notice_bytes(notice: PendingNotice, form: str) -> bytes:
    """The POST body of ``notice`` in ``form`` (``json`` or ``slack``), as UTF-8 JSON."""
    body = slack_body(notice) if form == "slack" else json_body(notice)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


__all__ = [
    "PENDING", "PendingNotice", "clean", "json_body", "notice_bytes", "rule_named", "slack_body", "slack_escape",
]
