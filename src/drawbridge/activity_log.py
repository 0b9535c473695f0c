"""The operator's live lines (``drawbridge.activity``): what the gateway and the control plane log of
each decision, approval and refused login, in one shape whatever module logs it.

Invariant: an activity line names who, what and how it ended -- agent, tool, action, the deciding rule
(``file:line``, ``file:schema`` for an argument schema), outcome, milliseconds, approval ids,
channels -- and never an argument value, a token or a key. Values that came from an agent or a client (its id, the tool name, a path) are sanitized (no
control characters) before they reach a line, and the formatter quotes what could split a line
(``drawbridge.cli.log_format``).

Theory of operation. Every line goes to the ``drawbridge.activity`` logger with ``extra={"activity":
{...}}``: the command's formatter renders the fields as ``key=value`` text or as one JSON object per
line. Building a line costs nothing when the logger is not enabled for its level.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from drawbridge.canonical import sanitize

ACTIVITY: Final = logging.getLogger("drawbridge.activity")
"""The operator's live view; serve and wrap show it at INFO whatever ``--verbose`` says."""


def activity(event: str, fields: Mapping[str, Any], level: int = logging.INFO) -> None:
    """One activity line: ``event`` then its fields (names and numbers only, never argument values)."""
    if ACTIVITY.isEnabledFor(level):
        ACTIVITY.log(level, "%s", event, extra={"activity": {"event": event, **fields}})


def rule_of(source_file: str | None, rule_index: int | None, policy: str | None, line: int | None) -> str:
    """The deciding rule as an operator finds it: ``file:line``, the rule's line as the reason and
    ``approvals show`` write it (``(team.yaml:10)``: ``file:N`` is always a line, never an index);
    ``file:schema`` when an argument schema of that file refused the call (a schema is the only
    decision with a file and no rule index: policy-format.md, section 4); ``policy #index (file)``,
    the notifications' form, should a rule come without its line; the policy name without a file;
    or ``default`` when no rule matched (default deny), ``gateway`` for the gateway's own refusals."""
    if source_file is not None:
        if rule_index is None:
            return f"{source_file}:schema"
        if line is not None:
            return f"{source_file}:{line}"
        return f"{policy} #{rule_index} ({source_file})"
    if policy is None:
        return "default"
    if rule_index is not None:
        return f"{policy} #{rule_index}"
    return policy


def refused_login(listener: str, scope: Mapping[str, Any]) -> None:
    """A WARNING line for a refused credential: where it came from and what was wrong with the header
    (missing, not a bearer token, unknown), never the token presented."""
    if not ACTIVITY.isEnabledFor(logging.WARNING):
        return
    values = [value for key, value in scope.get("headers", ()) if key.lower() == b"authorization"]
    if not values:
        problem = "missing"
    elif len(values) > 1:
        problem = "repeated"
    elif not values[0].strip().lower().startswith(b"bearer "):
        problem = "not_bearer"
    else:
        problem = "unknown_token"
    client = scope.get("client")
    login_refused(listener, problem, str(client[0]) if client else None, path=sanitize(str(scope.get("path", ""))))


def login_refused(
    listener: str, problem: str, client: str | None, *, level: int = logging.WARNING, **detail: str | None
) -> None:
    """The one ``login_refused`` line, whichever listener refused: what was wrong, never the token."""
    activity("login_refused", {"listener": listener, "problem": problem, "client": client, **detail}, level)


__all__ = ["ACTIVITY", "activity", "login_refused", "refused_login", "rule_of"]
