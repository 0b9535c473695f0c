"""``observed_confirmed``: a write's asserted side effect confirmed by a later read of the same target.

Invariant: a write is ``observed_confirmed`` only by the stricter rule of auditor-evidence.md 6.6,
which adds to Assay's ``promote_with_observed_read`` what it leaves to the caller:

1. the read is a later trace entry (a higher index) of the same run;
2. drawbridge classified it as a **read** (``READ_LEAVES``) of the same action class, and its
   narrowed target equals the write's (the same subject projection, ``audit_binding``);
3. the read was allowed and returned success (``action`` allow, ``outcome`` ok);
4. the write was allowed, succeeded, and is still ``asserted``.

The confirmation is a record of its own: the write's surface record restated at
``observed_confirmed`` (``verification_source`` ``observed_read_followup``, the digest
``binding_digest(write subject)``, as Assay's fixture has it) naming both entries in
``drawbridge.observed_read: {trace_index, write_trace_index}``. It is derived from the trace and
the write's record alone, so anyone recomputes it (``verify-export`` does). It is sequence evidence
within the run, not external verification: ``verify-side-effects`` still recomputes every call from
``asserted`` and does not credit it (it lists it as not credited). A confirmation is its write, not a
call of its own (``restated`` pairs the two): it is no decision of the run, and no audit record
verifies it apart from its write.

What the trace keeps for this: a read's ``tool_decision`` body holds ``observed_read:
{action_class, target_digest}``, ``target_digest`` being ``sha256(JCS({action_class, target}))`` of
the narrowed target (pseudonymised as the surface record's; never an argument value).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes, jcs_digest, parse_json
from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.audit_binding import binding_digest, subject_from_action
from drawbridge.evidence.classify import classify, tool_leaf
from drawbridge.evidence.runs import Run
from drawbridge.evidence.side_effect import SideEffect, SideEffectFormatError, SideEffectLevel, promoted

READ_LEAVES: Final = {
    "list_deploy_keys": ("add_deploy_key", "list"),
    "get_deploy_key": ("add_deploy_key", "get"),
    "list_members": ("add_member", "list"),
    "get_member": ("add_member", "get"),
    "list_admins": ("grant_admin", "list"),
    "get_role": ("grant_admin", "get"),
}
"""Read leaf -> (a write leaf of the same family, the read verb): the read's target is projected as
that family's write projects its own."""
MARK: Final = "drawbridge.observed_read"


def target_digest(subject: Mapping[str, Any]) -> str:
    return jcs_digest({"action_class": subject["action_class"], "target": subject["target"]})


def read_subject(tool: str, arguments: Any) -> dict[str, str] | None:
    """What a trace line keeps of a read call: its action class and target digest (None: not a read
    drawbridge knows, or its target cannot be projected)."""
    family = READ_LEAVES.get(tool_leaf(tool))
    if family is None:
        return None
    projection = classify(family[0], arguments)
    if projection.state != v.CLASSIFIED or projection.resource_type is None:
        return None
    subject = subject_from_action({"resource_type": projection.resource_type, "verb": family[1],
                                   "target": projection.target})
    if subject is None:
        return None
    try:
        return {"action_class": subject["action_class"], "target_digest": target_digest(subject)}
    except CanonicalizationError:
        return None


def _reads(lines: Sequence[bytes], run: Run) -> list[tuple[int, str, str, str]]:
    """``(index, at, action_class, target_digest)`` of the run's allowed, successful reads."""
    found = []
    for index in range(run.start_index, run.last_index + 1):
        if b'"observed_read":{' not in lines[index]:
            continue
        try:
            entry = parse_json(lines[index])
        except CanonicalizationError:
            continue
        body = entry.get("body") if isinstance(entry, dict) else None
        read = body.get("observed_read") if isinstance(body, dict) else None
        if entry.get("kind") != "tool_decision" or not isinstance(read, dict):
            continue
        if body.get("action") == "allow" and body.get("outcome") == "ok":
            found.append((index, entry["at"], str(read.get("action_class")), str(read.get("target_digest"))))
    return found


def confirmations(
    lines: Sequence[bytes], run: Run, writes: Sequence[tuple[int, Mapping[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """``(at of the read, confirming record)`` for each write of ``writes`` (``(trace index, surface
    record)``, in trace order) that a later read of the run confirms (module docstring)."""
    reads = _reads(lines, run)
    out: list[tuple[str, dict[str, Any]]] = []
    for write_index, envelope in writes:
        decisions = envelope.get("observed_tool_decisions")
        if not isinstance(decisions, list) or len(decisions) != 1 or not isinstance(decisions[0], dict):
            continue
        decision = decisions[0]
        response = decision.get("response") if isinstance(decision.get("response"), dict) else {}
        effect = decision.get("decision", {}).get("effect") if isinstance(decision.get("decision"), dict) else None
        try:
            side = SideEffect.from_json(response.get("side_effect"))
        except SideEffectFormatError:
            continue
        if effect != "allow" or response.get("status") != "success" or not side.asserted:
            continue
        if side.level is not SideEffectLevel.ASSERTED:
            continue
        subject = subject_from_action(decision.get("action"))
        digest = binding_digest(subject) if subject is not None else None
        if subject is None or digest is None:
            continue
        wanted = (subject["action_class"], target_digest(subject))
        read = next((r for r in reads if r[0] > write_index and (r[2], r[3]) == wanted), None)
        if read is None:
            continue
        confirmed = copy.deepcopy(dict(envelope))
        restated = confirmed["observed_tool_decisions"][0]
        restated["response"]["side_effect"] = promoted(side, SideEffectLevel.OBSERVED_CONFIRMED, digest).to_json()
        restated["response"]["side_effect_verified"] = False
        restated[MARK] = {"trace_index": read[0], "write_trace_index": write_index}
        out.append((read[1], confirmed))
    return out


_LADDER_FIELDS: Final = ("level", "verification_source", "verification_subject_digest")


def _without_restatement(decision: Any) -> bytes | None:
    """A decision as its restatement leaves it: without the mark, ``side_effect_verified`` and the
    ladder fields of ``side_effect`` (``confirmations`` changes nothing else)."""
    if not isinstance(decision, dict):
        return None
    bare = {key: value for key, value in decision.items() if key != MARK}
    response = dict(bare["response"]) if isinstance(bare.get("response"), dict) else {}
    response.pop("side_effect_verified", None)
    if isinstance(response.get("side_effect"), dict):
        response["side_effect"] = {k: val for k, val in response["side_effect"].items() if k not in _LADDER_FIELDS}
    bare["response"] = response
    try:
        return canonical_bytes(bare)
    except (CanonicalizationError, RecursionError):
        return None


def restated(decisions: Sequence[Any]) -> list[int | None]:
    """For each decision, the index of the decision it restates, else None. A confirmation is its write
    restated, the same call and not another: each decision that carries ``MARK`` is paired with the first
    unpaired decision without it that is equal to it but for what ``confirmations`` changes."""
    unpaired: dict[bytes, list[int]] = {}
    for index, decision in enumerate(decisions):
        key = _without_restatement(decision)
        if key is not None and MARK not in decision:
            unpaired.setdefault(key, []).append(index)
    restates: list[int | None] = [None] * len(decisions)
    for index, decision in enumerate(decisions):
        if isinstance(decision, dict) and MARK in decision:
            twins = unpaired.get(_without_restatement(decision) or b"", [])
            restates[index] = twins.pop(0) if twins else None
    return restates


def is_confirmation(record: Any) -> bool:
    decisions = record.get("observed_tool_decisions") if isinstance(record, dict) else None
    return isinstance(decisions, list) and any(isinstance(d, dict) and MARK in d for d in decisions)


__all__ = ["MARK", "READ_LEAVES", "confirmations", "is_confirmation", "read_subject", "restated", "target_digest"]
