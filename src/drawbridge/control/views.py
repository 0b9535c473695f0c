"""What the control plane shows: policies, served tools, approvals and grants as JSON objects.

Invariant: a view holds what was declared, digested or decided, never a token or an environment
value: tools show what the upstream declared; approvals show digests and shapes, and one pending
approval shown alone (``GET /approvals/{id}``) also its call's arguments as the gateway holds them in
memory for a person (``approval.shown_arguments``: secret-like values masked, long values cut). Pure.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from drawbridge.approval.shown_arguments import ShownArguments
from drawbridge.canonical import sanitize
from drawbridge.control.services import CatalogueItem
from drawbridge.policy.model import Policy
from drawbridge.state.approvals import Approval
from drawbridge.state.grants import Grant
from drawbridge.state.sqlite import to_db_time


def policy_view(policy: Policy) -> dict[str, Any]:
    """A policy as ``GET /policies`` shows it: rules with their conditions, schemas by tool name."""
    return {
        "name": policy.name,
        "agent": policy.agent.text,
        "source_file": policy.source_file,
        "line": policy.line,
        "description": policy.description,
        "rules": [
            {
                "index": rule.index,
                "line": rule.line,
                "tools": [pattern.text for pattern in rule.tools],
                "action": rule.action.value,
                "conditions": [
                    {"field": c.arg_text, "operator": c.op.value, "value": _jsonable(c.value)}
                    for c in rule.conditions
                ],
            }
            for rule in policy.rules
        ],
        "schemas": sorted(policy.schemas),
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return sanitize(str(value))
    return value


def tool_view(item: CatalogueItem) -> dict[str, Any]:
    """A served tool as ``GET /tools`` shows it: what the upstream declared and how it classifies."""
    tool = item.tool
    return {
        "name": item.name,
        "server": item.server,
        "upstream_name": item.upstream_name,
        "source": item.source,
        "title": tool.get("title") if isinstance(tool.get("title"), str) else None,
        "description": tool.get("description") if isinstance(tool.get("description"), str) else None,
        "input_schema": tool.get("inputSchema"),
        "annotations": tool.get("annotations"),
        "classification": item.classification.as_dict(),
        "pin_status": None if item.pin_status is None else item.pin_status.value,
        "dispatcher": item.dispatcher,
    }


def approval_view(approval: Approval, now: datetime) -> dict[str, Any]:
    """An approval as the control plane and the CLI show it: digests, shapes and names."""
    view: dict[str, Any] = {
        "id": approval.id,
        "short_id": approval.short_id,
        "agent": approval.agent,
        "tool": approval.tool,
        "args_digest": approval.args_digest,
        "args_shape": approval.args_shape,
        "reason": approval.reason,
        "policy": approval.policy,
        "source_file": approval.source_file,
        "rule_index": approval.rule_index,
        "status": str(approval.status),
        "created_at": to_db_time(approval.created_at),
        "expires_at": to_db_time(approval.expires_at),
        "remaining_seconds": int(approval.remaining(now).total_seconds()),
        "injection_findings": list(approval.injection_findings),
        "approver": str(approval.approver),
        "replica": approval.replica,
    }
    if not approval.pending:
        view.update(
            resolved_by=approval.resolved_by,
            channel=str(approval.channel) if approval.channel else None,
            strength=str(approval.strength) if approval.strength else None,
            resolution_reason=approval.resolution_reason,
            resolved_at=to_db_time(approval.resolved_at) if approval.resolved_at else None,
        )
    return view


def arguments_view(approval: Approval, shown: ShownArguments | None) -> dict[str, Any] | None:
    """The arguments of ``approval``'s call as a person is shown them: only while it is pending and
    the gateway holds them (else None)."""
    return shown.as_dict() if shown is not None and approval.pending else None


def grant_view(grant: Grant, now: datetime) -> dict[str, Any]:
    """A grant as the control plane shows it (no secrets in a grant; times as RFC 3339)."""
    record = grant.created_record()
    return {
        "id": grant.id,
        "agent": grant.agent_glob,
        "tools": grant.tools_glob,
        "granted_by": grant.granted_by,
        "created_at": record["created_at"],
        "expires_at": record["expires_at"],
        "remaining_seconds": int(grant.remaining(now).total_seconds()),
        "active": grant.active_at(now),
    }
