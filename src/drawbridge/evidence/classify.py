"""Rule-based privileged-action classifiers and target pseudonymisation.

Invariant: the classifier is total and reads arguments only to project named
target fields. Every tool name (any string) and every JSON value as arguments
yields exactly one :class:`Classification`, never an exception, and nothing
from the arguments reaches it except the projected fields: ``owner``, ``repo``
and ``role`` as sanitised plain labels, ``read_only`` as a boolean, and the
identifiers below as domain-separated hashes. Every other argument, secret or
not, is dropped by construction; no deny-list drives it.

Theory of operation (evidence-formats.md §1.4, 1.5):

1. The *leaf* is the tool name after its last ``.`` (the whole name if there is
   none). Matching is exact and case-sensitive.
2. Leaves are tried in a fixed order: github deploy key, slack membership,
   workspace admin; anything else is ``observed_unknown_tool``, which is never
   read as clean.
3. A field is read only when ``arguments`` is an object and the field holds a
   JSON string (``read_only``: a JSON boolean). Anything else counts as missing.
4. A matched leaf whose required fields are missing is
   ``classified_incomplete`` with ``missing_required_target_field`` and a
   ``detail`` naming what is missing: missing arguments are never safe.

Python strings can hold lone surrogates (``json.loads`` accepts ``"\\ud800"``),
which Rust strings cannot. Such a character is replaced by U+FFFD, as a lossy
UTF-8 decoder would, both in record text and before hashing, so that every
record is encodable; Assay cannot receive these inputs, so no digest
compatibility is at stake.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import rust_trim, sanitize
from drawbridge.evidence import vocabulary as v

TARGET_HASH_PREFIX: Final = "assay.tool_target.v0:"

_SURROGATE = re.compile("[\ud800-\udfff]")


def _unpaired_to_replacement(value: str) -> str:
    return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value


def record_text(value: str) -> str:
    """Text as it may appear in a record: Cc controls (except TAB/LF/CR) and
    lone surrogates become U+FFFD, so a hostile name cannot smuggle terminal
    escapes or unencodable code points into evidence."""
    return sanitize(_unpaired_to_replacement(value))


def target_hash(domain: str, value: str) -> str:
    """Domain-separated pseudonym of an identifier: equal inputs give equal
    hashes (pseudonymisation, not anonymisation); the raw value is not stored.

    ``sha256("assay.tool_target.v0:" + domain + ":" + lower(trim(value)))``
    with Rust ``str::trim`` semantics. The value is not sanitised first.
    """
    normalized = rust_trim(_unpaired_to_replacement(value)).lower()
    preimage = f"{TARGET_HASH_PREFIX}{domain}:{normalized}"
    return "sha256:" + hashlib.sha256(preimage.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Classification:
    """The classifier's verdict on one call. ``target`` is a fresh dict in the
    wire's insertion order (None for an unknown tool); the caller owns it."""

    category: str | None
    state: str
    action_class: str
    verb: str | None
    resource_type: str | None
    target: dict[str, Any] | None
    reason_code: str
    detail: str | None = None

    @property
    def required_scope(self) -> str | None:
        return v.REQUIRED_SCOPE.get(self.category) if self.category is not None else None


def _str_field(arguments: Any, key: str) -> str | None:
    if isinstance(arguments, dict):
        value = arguments.get(key)
        if isinstance(value, str):
            return value
    return None


def _first_str(arguments: Any, *keys: str) -> str | None:
    for key in keys:
        value = _str_field(arguments, key)
        if value is not None:
            return value
    return None


def tool_leaf(tool_name: str) -> str:
    """The part after the last ``.``; ``"a.b."`` has the empty leaf."""
    return tool_name.rsplit(".", 1)[-1]


_GITHUB_LEAVES: Final = frozenset({"add_deploy_key", "create_deploy_key"})
_SLACK_LEAVES: Final = frozenset({"add_member", "invite"})
#: Workspace-admin leaf -> verb. Deliberately narrow: anything else is unknown.
WORKSPACE_ADMIN_VERBS: Final = {
    "grant_admin": "grant",
    "change_role": "change_role",
    "invite_external": "invite",
    "modify_org_policy": "modify",
    "create_workspace_token": "create",
}


def _incomplete(category: str, verb: str, target: dict[str, Any], detail: str) -> Classification:
    return Classification(
        category=category,
        state=v.CLASSIFIED_INCOMPLETE,
        action_class=v.PRIVILEGED_ADMIN_ACTION,
        verb=verb,
        resource_type=v.RESOURCE_TYPE[category],
        target=target,
        reason_code=v.REASON_MISSING_REQUIRED_TARGET_FIELD,
        detail=detail,
    )


def _classified(category: str, verb: str, target: dict[str, Any], reason: str) -> Classification:
    return Classification(
        category=category,
        state=v.CLASSIFIED,
        action_class=v.PRIVILEGED_ADMIN_ACTION,
        verb=verb,
        resource_type=v.RESOURCE_TYPE[category],
        target=target,
        reason_code=reason,
    )


def _github_deploy_key(arguments: Any) -> Classification:
    owner = _str_field(arguments, "owner")
    repo = _str_field(arguments, "repo")
    target: dict[str, Any] = {"provider": "github"}
    if owner is not None:
        target["owner"] = record_text(owner)
    if owner is None or repo is None:
        return _incomplete(v.GITHUB_DEPLOY_KEY, "create", target, v.DETAIL_MISSING_GITHUB_OWNER_OR_REPO)
    target["repo"] = record_text(repo)
    title = _first_str(arguments, "title", "key_title")
    if title is not None:
        target["key_title_hash"] = target_hash("github_key_title", title)
    read_only = arguments.get("read_only")  # arguments is a dict: owner was read from it
    if isinstance(read_only, bool):
        target["read_only"] = read_only
    return _classified(v.GITHUB_DEPLOY_KEY, "create", target, v.REASON_CLASSIFIED_GITHUB_DEPLOY_KEY)


def _slack_add_member(arguments: Any) -> Classification:
    workspace = _str_field(arguments, "workspace_id")
    channel = _str_field(arguments, "channel_id")
    principal = _first_str(arguments, "user_id", "user")
    if principal is not None and (workspace is not None or channel is not None):
        target = {
            "provider": "slack",
            "workspace_id_hash": None if workspace is None else target_hash("slack_workspace", workspace),
            "channel_id_hash": None if channel is None else target_hash("slack_channel", channel),
            "principal_hash": target_hash("slack_principal", principal),
        }
        return _classified(v.SLACK_ADD_MEMBER, "add", target, v.REASON_CLASSIFIED_SLACK_ADD_MEMBER)
    detail = v.DETAIL_MISSING_SLACK_PRINCIPAL if principal is None else v.DETAIL_MISSING_SLACK_SCOPE
    return _incomplete(v.SLACK_ADD_MEMBER, "add", {"provider": "slack"}, detail)


def _workspace_admin(verb: str, arguments: Any) -> Classification:
    workspace = _first_str(arguments, "workspace_id", "workspace", "org")
    principal = _first_str(arguments, "principal", "user")
    if workspace is None or principal is None:
        detail = v.DETAIL_MISSING_WORKSPACE_ID if workspace is None else v.DETAIL_MISSING_WORKSPACE_PRINCIPAL
        return _incomplete(v.WORKSPACE_ADMIN, verb, {"provider": "workspace"}, detail)
    target: dict[str, Any] = {
        "provider": "workspace",
        "workspace_id_hash": target_hash("workspace", workspace),
        "principal_hash": target_hash("workspace_principal", principal),
    }
    role = _str_field(arguments, "role")
    if role is not None:
        target["role"] = record_text(role)
    return _classified(v.WORKSPACE_ADMIN, verb, target, v.REASON_CLASSIFIED_WORKSPACE_ADMIN)


UNKNOWN: Final = Classification(
    category=None,
    state=v.OBSERVED_UNKNOWN_TOOL,
    action_class=v.UNCLASSIFIED,
    verb=None,
    resource_type=None,
    target=None,
    reason_code=v.REASON_UNKNOWN_TOOL_NAME,
)


def classify(tool_name: str, arguments: Any) -> Classification:
    """Classify one call. Total over every string and every JSON value."""
    leaf = tool_leaf(tool_name)
    if leaf in _GITHUB_LEAVES:
        return _github_deploy_key(arguments)
    if leaf in _SLACK_LEAVES:
        return _slack_add_member(arguments)
    verb = WORKSPACE_ADMIN_VERBS.get(leaf)
    if verb is not None:
        return _workspace_admin(verb, arguments)
    return UNKNOWN
