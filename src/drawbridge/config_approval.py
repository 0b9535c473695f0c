"""The ``approval`` section of serve's configuration: how long a question waits, how it is asked, what
approval memory counts, and the webhooks a pending approval is posted to (``config_notify``).

Invariant: every value loads as the gateway will use it or the file does not load: the timeout is
positive and finite, ``memory.min_approvals`` an integer of at least 1, and no key other than those
documented (docs/configuration.md#approval) is accepted. Approval memory is off unless ``memory`` is
configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drawbridge.config_notify import notify_targets
from drawbridge.config_reader import Reader

APPROVAL_KEYS = frozenset({"timeout_seconds", "non_blocking", "elicitation", "ask_by_link", "memory", "notify"})
MEMORY_KEYS = frozenset({"enabled", "min_approvals", "count_client_answers"})


def approval_section(top: Reader, env: Mapping[str, str], *, notify_used: bool) -> dict[str, Any]:
    """The ``approval_*`` fields of ``GatewayConfig``, read from the file's ``approval`` section."""
    fields: dict[str, Any] = {}
    approval = top.child("approval")
    if approval is None:
        return fields
    approval.check_keys(set(APPROVAL_KEYS))
    timeout = approval.get("timeout_seconds", float, default=300.0)
    if not timeout > 0 or timeout == float("inf"):
        raise approval.fail("timeout_seconds", "approval.timeout_seconds must be positive and finite")
    fields.update(
        approval_timeout_seconds=timeout,
        approval_non_blocking=approval.get("non_blocking", bool, default=False),
        approval_elicitation=approval.get("elicitation", bool, default=True),
        approval_ask_by_link=approval.get("ask_by_link", bool, default=False),
    )
    if (memory := approval.child("memory")) is not None:
        memory.check_keys(set(MEMORY_KEYS))
        minimum = memory.get("min_approvals", int, default=3)
        if isinstance(minimum, bool) or minimum < 1:
            raise memory.fail("min_approvals", "approval.memory.min_approvals must be an integer of at least 1")
        fields.update(
            approval_memory_enabled=memory.get("enabled", bool, default=True),
            approval_memory_min_approvals=minimum,
            approval_memory_count_client_answers=memory.get("count_client_answers", bool, default=False),
        )
    fields["approval_notify"] = notify_targets(approval, env, used=notify_used)
    return fields


__all__ = ["APPROVAL_KEYS", "approval_section"]
