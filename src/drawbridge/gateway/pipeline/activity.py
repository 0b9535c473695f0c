"""The decision line of each recorded tools/call (``drawbridge.activity_log`` holds the line's shape
and its invariant: never an argument value).

Theory of operation. ``log_decision`` is an observer of the ``EvidenceGuard``: it sees each call record
once it is written, so a line says what the trace says. With a shadow policy, the line of a call the
policies decided also says what the shadow would have decided (``shadow``, ``shadow_rule``,
``shadow_differs``), which the trace never says.
"""

from __future__ import annotations

import logging
from typing import Any

from drawbridge.activity_log import ACTIVITY, rule_of
from drawbridge.canonical import sanitize
from drawbridge.gateway.pipeline.records import CallRecord


def log_decision(record: CallRecord) -> None:
    """The decision line of one recorded call (an observer of ``EvidenceGuard``)."""
    if not ACTIVITY.isEnabledFor(logging.INFO):
        return
    provenance = record.provenance
    fields: dict[str, Any] = {
        "agent": sanitize(record.agent),
        "tool": sanitize(record.tool) if record.tool is not None else None,
        "action": record.action.value if record.action is not None else None,
        "rule": (
            rule_of(provenance.source_file, provenance.rule_index, provenance.policy, provenance.line)
            if provenance is not None else None
        ),
        "outcome": record.outcome.value,
        "ms": round(record.latency_ms, 2),
    }
    shadow = provenance.shadow if provenance is not None else None
    if shadow is not None:  # a shadow policy decided it too (``shadow``): reported, never enforced
        fields.update(shadow=shadow.shown, shadow_rule=shadow.rule, shadow_differs=shadow.differs)
    if record.approval is not None:
        how = record.approval.get("how")
        if how is not None:
            fields["approval"] = sanitize(str(how))
    if record.result_guard is not None:  # kinds, counts and bytes only, never a secret
        fields["guard"] = record.result_guard.log_field()
    ACTIVITY.info("%s", "decision", extra={"activity": {"event": "decision", **fields}})


__all__ = ["log_decision"]
