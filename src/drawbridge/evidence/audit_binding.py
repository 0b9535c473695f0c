"""Audit-record binding: when an imported provider audit record vouches for one observed call.

Invariant: a record binds only when its own ``binding_digest`` recomputes from its ``subject`` and
that digest equals the call's subject digest, recomputed here from committed bytes; a rejection is a
value naming the first check that failed, never a silent None, because a record that failed and a
record never imported must not look alike. Only a bound record promotes a call to ``verified``.

Theory of operation (evidence-formats.md §3):

1. Binding. ``binding_digest(subject) = "sha256:" + hex(sha256(JCS(subject)))``.
   A call's subject is ``{action_class, verb, target}`` projected from its
   ``action`` (``action_class`` is ``action.resource_type``; ``target`` is
   narrowed to the fields of the subject table below). An audit record binds
   when (1) its own ``binding_digest`` recomputes from its ``subject`` and (2)
   that digest equals the call's subject digest. The first failing check is
   the one reported; a rejection is a value (:data:`AuditBinding`), never a
   silent None, because a record that failed and a record never imported must
   not look alike.

2. Binding subjects, per ``action_class`` (all values copied verbatim from the
   decision's ``action.target``; see docs/side-effect-subjects.md):

   * ``github_deploy_key`` (category github_deploy_key): target narrowed to
     ``owner``, ``repo``, ``key_title_hash``, each present key copied as is
     (null included); no such key at all: not projectable. Byte-identical to
     Assay, including its reach: a ``classified_incomplete`` call that names
     only ``owner`` projects ``{owner}``. ``provider`` and ``read_only``
     describe our request, not the effect, and never enter a subject.
   * ``workspace_member`` (category slack_add_member): target narrowed to
     ``workspace_id_hash``, ``channel_id_hash``, ``principal_hash``. Only
     string values are copied; a null (e.g. ``channel_id_hash`` of a
     workspace-level membership) is omitted. Projectable only with
     ``principal_hash`` and at least one of the two scope hashes, as the
     classifier requires for ``classified``.
   * ``workspace_role`` (category workspace_admin): target narrowed to
     ``workspace_id_hash``, ``principal_hash``, ``role``. Only string values
     are copied; an absent or null role is omitted. Projectable only with both
     hashes.
   * any other ``action_class``: Assay's rule (``owner``, ``repo``,
     ``key_title_hash``), so that a subject Assay can bind we bind alike.

   Assay itself projects only github deploy keys (evidence-formats.md §7.2
   item 5); the two new subjects let every classified category reach
   ``verified``. Widening a table row changes every binding of that class.
"""


from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, jcs_digest
from drawbridge.evidence.side_effect import SideEffect, SideEffectLevel, promoted

# --- binding --------------------------------------------------------------------

REASON_NO_SUBJECT: Final = "audit record has no subject"
REASON_NO_BINDING_DIGEST: Final = "audit record has no binding_digest"
REASON_SUBJECT_NOT_CANONICALIZABLE: Final = "audit record subject is not canonicalizable"
REASON_ACTION_UNCLASSIFIED: Final = "observed action is unclassified"
REASON_ACTION_NOT_CANONICALIZABLE: Final = "observed action is not canonicalizable"
REASON_NOT_ASSERTED: Final = "side effect was not asserted"

NOT_PROJECTABLE_REASONS: Final = (
    REASON_NO_SUBJECT,
    REASON_NO_BINDING_DIGEST,
    REASON_SUBJECT_NOT_CANONICALIZABLE,
    REASON_ACTION_UNCLASSIFIED,
    REASON_ACTION_NOT_CANONICALIZABLE,
    REASON_NOT_ASSERTED,
)


@dataclass(frozen=True)
class Bound:
    """Both checks hold: the record is consistent and binds to this call."""

    subject_digest: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": "bound", "subject_digest": self.subject_digest}


@dataclass(frozen=True)
class RecordInconsistent:
    """The record's ``binding_digest`` is not the digest of its own subject."""

    recomputed: str
    declared: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": "record_inconsistent", "recomputed": self.recomputed, "declared": self.declared}


@dataclass(frozen=True)
class BindsDifferentCall:
    """The record is consistent but describes a different call."""

    record_digest: str
    call_digest: str

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": "binds_different_call",
            "record_digest": self.record_digest,
            "call_digest": self.call_digest,
        }


@dataclass(frozen=True)
class NotProjectable:
    """The record or the call has no subject to compare; ``reason`` says which."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": "not_projectable", "reason": self.reason}


AuditBinding = Bound | RecordInconsistent | BindsDifferentCall | NotProjectable


def binding_digest(subject: Any) -> str | None:
    """``sha256:`` over the JCS bytes of ``subject``; None if it has no canonical form."""
    try:
        return jcs_digest(subject)
    except (CanonicalizationError, RecursionError):
        return None


#: ``action_class`` -> the target fields of its binding subject.
SUBJECT_TARGET_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "github_deploy_key": ("owner", "repo", "key_title_hash"),
    "workspace_member": ("workspace_id_hash", "channel_id_hash", "principal_hash"),
    "workspace_role": ("workspace_id_hash", "principal_hash", "role"),
}
#: Assay's narrowing, kept for ``action_class`` values outside the table.
DEFAULT_SUBJECT_TARGET_FIELDS: Final = ("owner", "repo", "key_title_hash")


def _narrow_verbatim(target: dict[str, Any], fields: Sequence[str]) -> dict[str, Any] | None:
    projected = {f: target[f] for f in fields if f in target}
    return projected or None


def _narrow_strings(target: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    return {f: target[f] for f in fields if isinstance(target.get(f), str)}


def _narrow_target(action_class: str, target: dict[str, Any]) -> dict[str, Any] | None:
    if action_class == "workspace_member":
        projected = _narrow_strings(target, SUBJECT_TARGET_FIELDS[action_class])
        has_scope = "workspace_id_hash" in projected or "channel_id_hash" in projected
        return projected if "principal_hash" in projected and has_scope else None
    if action_class == "workspace_role":
        projected = _narrow_strings(target, SUBJECT_TARGET_FIELDS[action_class])
        return projected if "workspace_id_hash" in projected and "principal_hash" in projected else None
    return _narrow_verbatim(target, SUBJECT_TARGET_FIELDS.get(action_class, DEFAULT_SUBJECT_TARGET_FIELDS))


def subject_from_action(action: Any) -> dict[str, Any] | None:
    """The binding subject of a decision's ``action``, or None when there is
    nothing to bind (unclassified, incomplete, or no identifying target field):
    a subject invented from nothing would mint bindings that match nothing."""
    if not isinstance(action, dict):
        return None
    action_class = action.get("resource_type")
    verb = action.get("verb")
    target = action.get("target")
    if not isinstance(action_class, str) or not isinstance(verb, str) or not isinstance(target, dict):
        return None
    narrowed = _narrow_target(action_class, target)
    if narrowed is None:
        return None
    return {"action_class": action_class, "verb": verb, "target": narrowed}


def check_record_consistency(record: Any) -> str | RecordInconsistent | NotProjectable:
    """Check 1 alone: the record's digest, when its subject recomputes to its
    ``binding_digest``; else the rejection."""
    if not isinstance(record, dict) or "subject" not in record:
        return NotProjectable(REASON_NO_SUBJECT)
    declared = record.get("binding_digest")
    if not isinstance(declared, str):
        return NotProjectable(REASON_NO_BINDING_DIGEST)
    recomputed = binding_digest(record["subject"])
    if recomputed is None:
        return NotProjectable(REASON_SUBJECT_NOT_CANONICALIZABLE)
    if recomputed != declared:
        return RecordInconsistent(recomputed=recomputed, declared=declared)
    return recomputed


def check_audit_record(record: Any, action: Any) -> AuditBinding:
    """Both checks, in order: the record is internally consistent, then it
    binds to this call (not merely to some call of the same shape)."""
    recomputed = check_record_consistency(record)
    if not isinstance(recomputed, str):
        return recomputed
    call_subject = subject_from_action(action)
    if call_subject is None:
        return NotProjectable(REASON_ACTION_UNCLASSIFIED)
    call_digest = binding_digest(call_subject)
    if call_digest is None:
        return NotProjectable(REASON_ACTION_NOT_CANONICALIZABLE)
    if call_digest != recomputed:
        return BindsDifferentCall(record_digest=recomputed, call_digest=call_digest)
    return Bound(subject_digest=recomputed)


def promote_with_audit_record(
    side_effect: SideEffect, record: Any, action: Any
) -> tuple[SideEffect, AuditBinding]:
    """``verified`` if and only if the record binds; the outcome comes back with
    the block so no caller can promote without holding the reason."""
    if not side_effect.asserted:
        return side_effect, NotProjectable(REASON_NOT_ASSERTED)
    binding = check_audit_record(record, action)
    if isinstance(binding, Bound):
        return promoted(side_effect, SideEffectLevel.VERIFIED, binding.subject_digest), binding
    return side_effect, binding


def promote_with_observed_read(side_effect: SideEffect, write_action: Any, read_action: Any) -> SideEffect:
    """``observed_confirmed`` when a later read in the same run projects to the
    same ``action_class`` and target (the verb may differ: a list confirms a
    create). Only from ``asserted``: never overwrites or downgrades a higher
    rung, and never climbs past ``observed_confirmed``."""
    if not side_effect.asserted or side_effect.level is not SideEffectLevel.ASSERTED:
        return side_effect
    write = subject_from_action(write_action)
    read = subject_from_action(read_action)
    if write is None or read is None:
        return side_effect
    if write["action_class"] != read["action_class"] or write["target"] != read["target"]:
        return side_effect
    digest = binding_digest(write)
    if digest is None:
        return side_effect
    return promoted(side_effect, SideEffectLevel.OBSERVED_CONFIRMED, digest)
