"""The side-effect verifier of a whole surface document, and the claim gate its report applies.

Invariant: the report never claims more than the weakest evidence supports: each asserting call
takes at most one bound audit record (one record never vouches for two calls), every imported
record is reported with why it did or did not bind, and the claim gate (``CLAIM_GATE``) caps what a
consumer may claim at each level. An imported audit file that is not JSON is never read as "no
record": it fails the verification (``AuditImportError``), in ``verify-side-effects``,
``export`` and ``verify-export`` alike; an auditor package holds only records consistent in
themselves (``package_audit_record``).

Theory of operation (evidence-formats.md 3):

4. Verifier (:func:`verify_side_effects`), as Assay's ``verify-side-effects``
   but deterministic: audit records are tried in order of their source label
   (code-point order; ties keep the given order), whereas Assay follows the
   file system's directory order. Each asserting call takes the first unused
   record that binds (one-to-one: one record never vouches for two calls);
   otherwise it keeps the first rejection. Every imported record is reported
   with its own consistency check, the call it bound to, and each rejection
   met on the way. The claim gate is the table :data:`CLAIM_GATE`. Not
   implemented: Assay's egress refutation (``--observation-health``,
   ``--observed-peers``); rows never carry ``egress``, which in Assay's report
   means "no refutation attempted". Like Assay, the verifier never derives
   ``observed_confirmed``: it recomputes every call from ``asserted``. A call
   recorded at ``observed_confirmed`` through ``observed_read_followup`` (the
   gateway's read follow-up, ``observed_read``) is listed in
   ``levels_not_credited``: in-run sequence evidence, reported and not
   credited, and not an overclaim; ``verify-export`` checks its rule.
"""


from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.audit_binding import (
    AuditBinding,
    Bound,
    check_record_consistency,
    promote_with_audit_record,
)
from drawbridge.evidence.classify import record_text
from drawbridge.evidence.side_effect import SideEffect, SideEffectFormatError, SideEffectLevel, VerificationSource

# --- the claim gate -------------------------------------------------------------


@dataclass(frozen=True)
class ClaimGateRow:
    """What one level lets a consumer claim. Coverage is ``partial`` above
    ``asserted``, never ``observed``: a level is evidence about one call, not
    coverage of a dimension, so an absence claim is always blocked."""

    source_class: str
    coverage: str
    occurrence_claim: str
    occurrence_ceiling: str
    bounded_negative_claim: str


#: Assay's coding-agent claim gate evaluated at the three (source class,
#: coverage) pairs the ladder uses (evidence-formats.md 3.4 step 5).
CLAIM_GATE: Final[Mapping[SideEffectLevel, ClaimGateRow]] = {
    SideEffectLevel.ASSERTED: ClaimGateRow(
        "producer_reported", "self_reported", "degraded", "asserted", "blocked"
    ),
    SideEffectLevel.OBSERVED_CONFIRMED: ClaimGateRow(
        "boundary_observed", "partial", "allowed", "observed_in_path", "blocked"
    ),
    SideEffectLevel.VERIFIED: ClaimGateRow(
        "third_party_observed", "partial", "allowed", "independently_confirmed", "blocked"
    ),
}


def weakest_occurrence_ceiling(decisions: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
    """Fold ``(occurrence_claim, ceiling)`` of the asserting calls into what the
    run as a whole supports: the weakest rung, never the strongest. Any blocked
    claim (or a claim owing a rung without one) blocks; an empty set claims
    nothing, which is a different fact from blocked."""
    weakest: int | None = None
    for decision, ceiling in decisions:
        if decision == "blocked" or ceiling is None:
            return {"state": "blocked"}
        rank = v.CLAIM_CEILINGS.index(ceiling)
        weakest = rank if weakest is None else min(weakest, rank)
    if weakest is None:
        return {"state": "nothing_claimed"}
    return {"state": "rung", "ceiling": v.CLAIM_CEILINGS[weakest]}


# --- loading and verifying ------------------------------------------------------


class SurfaceFormatError(ValueError):
    """A surface document the verifier cannot read without guessing."""


class AuditImportError(ValueError):
    """An imported audit file that cannot be taken as evidence; the message names the file."""


def parse_audit_file(label: str, data: bytes) -> Any:
    """The JSON of one imported audit file. A file that is not JSON fails closed: skipping it could hide
    a record an auditor meant to import, and a package could not be checked again from it."""
    try:
        return parse_json(data)
    except (CanonicalizationError, UnicodeDecodeError):
        raise AuditImportError(f"{record_text(label)} is not JSON") from None


def package_audit_record(label: str, data: bytes) -> dict[str, Any]:
    """One file of an auditor package's ``audit-import/``: an ``assay.provider_audit_record.v0`` whose
    ``binding_digest`` is the digest of its own subject (what ``export`` writes, and nothing else)."""
    value = parse_audit_file(label, data)
    kept, skipped = load_audit_records([(label, value)])
    if skipped:
        raise AuditImportError(f"{skipped[0]['source']} is not an audit record: {skipped[0]['reason']}")
    check = check_record_consistency(kept[0][1])
    if not isinstance(check, str):
        raise AuditImportError(f"{record_text(label)}: {describe_rejection(check.to_json())}")
    return kept[0][1]


def describe_rejection(binding: Any) -> str:
    """A binding outcome of a report, in words (its ``reason`` when it has one)."""
    if not isinstance(binding, dict):
        return "-"
    outcome = str(binding.get("outcome", "?"))
    if "reason" in binding:
        return f"{outcome}: {binding['reason']}"
    if outcome == "record_inconsistent":
        return f"{outcome}: binding_digest is not the digest of the record's own subject"
    if outcome == "binds_different_call":
        return f"{outcome}: the record describes another call"
    return outcome


def load_audit_records(
    items: Sequence[tuple[str, Any]],
) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, str]]]:
    """Keep the ``assay.provider_audit_record.v0`` objects of already-parsed
    JSON, in the given order; report every other item with why it was skipped
    (an import directory may hold other artifacts, but nothing vanishes)."""
    kept: list[tuple[str, dict[str, Any]]] = []
    skipped: list[dict[str, str]] = []
    for label, value in items:
        if not isinstance(value, dict):
            skipped.append({"source": record_text(label), "reason": "not a JSON object"})
        elif "schema" not in value:
            skipped.append({"source": record_text(label), "reason": "no schema field"})
        elif value["schema"] != v.PROVIDER_AUDIT_RECORD_SCHEMA:
            reason = f"schema is not {v.PROVIDER_AUDIT_RECORD_SCHEMA}"
            skipped.append({"source": record_text(label), "reason": reason})
        else:
            kept.append((label, value))
    return kept, skipped


@dataclass(frozen=True)
class SurfaceCall:
    """What the verifier reads from one decision entry, after its shape checks."""

    tool: str
    asserted: bool
    action: Any
    recorded: SideEffect | None
    recorded_verified_flag: bool | None


_MAX_NAME_IN_ERROR: Final = 120


def _name_for_error(decision: dict[str, Any]) -> str:
    tool = decision.get("tool")
    name = tool.get("name") if isinstance(tool, dict) else None
    if not isinstance(name, str):
        return "?"
    shown = record_text(name)
    return shown if len(shown) <= _MAX_NAME_IN_ERROR else shown[:_MAX_NAME_IN_ERROR] + "..."


def _read_call(index: int, decision: Any) -> SurfaceCall:
    if not isinstance(decision, dict):
        raise SurfaceFormatError(f"observed_tool_decisions[{index}] is not a JSON object")
    where = f"observed_tool_decisions[{index}] (tool {_name_for_error(decision)!r})"
    response = decision.get("response")
    if not isinstance(response, dict) or "side_effect_asserted" not in response:
        raise SurfaceFormatError(f"{where} is missing response.side_effect_asserted")
    asserted = response["side_effect_asserted"]
    if not isinstance(asserted, bool):
        raise SurfaceFormatError(f"{where} has response.side_effect_asserted that is not a boolean")
    verified_flag = response.get("side_effect_verified")
    if verified_flag is not None and not isinstance(verified_flag, bool):
        raise SurfaceFormatError(f"{where} has response.side_effect_verified that is not a boolean")
    recorded: SideEffect | None = None
    if response.get("side_effect") is not None:
        try:
            recorded = SideEffect.from_json(response["side_effect"])
        except SideEffectFormatError as exc:
            raise SurfaceFormatError(f"{where}: {exc}") from None
        if recorded.asserted != asserted:
            raise SurfaceFormatError(f"{where}: side_effect.asserted disagrees with side_effect_asserted")
        if verified_flag is not None and verified_flag != recorded.verified_flag:
            raise SurfaceFormatError(f"{where}: side_effect_verified disagrees with side_effect.level")
    elif verified_flag and not asserted:
        raise SurfaceFormatError(f"{where}: side_effect_verified is true for a call that asserted nothing")
    tool = decision.get("tool")
    name = tool.get("name") if isinstance(tool, dict) else None
    return SurfaceCall(
        tool=record_text(name) if isinstance(name, str) else "?",
        asserted=asserted,
        action=decision.get("action"),
        recorded=recorded,
        recorded_verified_flag=verified_flag,
    )


def read_surface_calls(surface_doc: Any) -> list[SurfaceCall]:
    """Shape checks (evidence-formats.md 3.4 step 3), failing closed with the
    position of the first offence: a malformed document never reads as a run
    that asserted nothing."""
    if not isinstance(surface_doc, dict):
        raise SurfaceFormatError("surface document is not a JSON object")
    if surface_doc.get("schema") != v.SURFACE_SCHEMA:
        raise SurfaceFormatError(f"surface document schema is not {v.SURFACE_SCHEMA}")
    if "observed_tool_decisions" not in surface_doc:
        raise SurfaceFormatError("surface document is missing observed_tool_decisions")
    decisions = surface_doc["observed_tool_decisions"]
    if not isinstance(decisions, list):
        raise SurfaceFormatError("observed_tool_decisions is not an array")
    return [_read_call(i, d) for i, d in enumerate(decisions)]


def _recorded_level(call: SurfaceCall) -> SideEffectLevel | None:
    if call.recorded is not None:
        return call.recorded.level
    if call.recorded_verified_flag:  # a legacy record claiming verification without a ladder block
        return SideEffectLevel.VERIFIED
    return None


def verify_side_effects(
    surface_doc: dict[str, Any],
    audit_records: Sequence[tuple[str, dict[str, Any]]],
    *,
    bundle: str | None = None,
) -> dict[str, Any]:
    """Re-derive every call's side-effect level from imported audit records.

    ``audit_records`` are ``(source label, record)`` pairs (see
    :func:`load_audit_records`); they are tried in label order. Returns the
    ``assay.side_effect_verification.v0`` report (fields of evidence-formats.md
    3.4, ``bundle`` being the optional label of the surface document) plus:

    * per call, ``level_before`` (the level the document records; null when it
      has no ladder block), ``irreversibility_class`` when recorded, and
      ``unevidenced_and_consequential`` for the re-derived level;
    * ``audit_records``: every record with ``source``, ``record_id``, its own
      consistency ``check``, ``status`` (matched / unmatched / rejected),
      ``matched_call`` (index into ``calls``) and each ``rejections`` entry
      ``{call, binding}`` met while trying it;
    * ``levels_not_reproduced``: calls whose recorded level (or legacy
      ``side_effect_verified: true``) is above what the evidence re-derives;
    * ``levels_not_credited``: calls recorded ``observed_confirmed`` by a read
      follow-up, which this verifier does not credit (module docstring);
    * ``audit_records_rejected``: records whose own check fails (no subject, no
      ``binding_digest``, not canonicalisable, or internally inconsistent);
    * ``ok``: no level is overclaimed and no imported record is rejected by its
      own check. Unmatched records do not make a run fail, and promoting
      nothing is still ok: ``asserted`` is an honest level and a missing
      export is the ordinary case.

    Raises :class:`SurfaceFormatError` on a document of the wrong shape.
    """
    calls = read_surface_calls(surface_doc)
    for pair in audit_records:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError("audit_records must be (source label, record) pairs")
    ordered = sorted(audit_records, key=lambda pair: pair[0])
    matched_call: list[int | None] = [None] * len(ordered)
    rejections: list[list[dict[str, Any]]] = [[] for _ in ordered]

    rows: list[dict[str, Any]] = []
    promoted = 0
    not_reproduced = not_credited = 0
    for index, call in enumerate(calls):
        irreversibility = call.recorded.irreversibility_class if call.recorded is not None else None
        side_effect = SideEffect(asserted=call.asserted, irreversibility_class=irreversibility)
        first_rejection: AuditBinding | None = None
        bound: Bound | None = None
        if call.asserted:
            for r, (_label, record) in enumerate(ordered):
                if matched_call[r] is not None:
                    continue  # one record never vouches for two calls
                side_effect, binding = promote_with_audit_record(side_effect, record, call.action)
                if isinstance(binding, Bound):
                    bound = binding
                    matched_call[r] = index
                    promoted += 1
                    break
                rejections[r].append({"call": index, "binding": _binding_json(binding)})
                if first_rejection is None:
                    first_rejection = binding

        level_before = _recorded_level(call)
        followup = (level_before is SideEffectLevel.OBSERVED_CONFIRMED and call.recorded is not None
                    and call.recorded.verification_source is VerificationSource.OBSERVED_READ_FOLLOWUP)
        if followup and side_effect.level.rank < level_before.rank:  # type: ignore[union-attr]
            not_credited += 1  # sequence evidence in the run: reported, not credited, not an overclaim
        elif level_before is not None and level_before.rank > side_effect.level.rank:
            not_reproduced += 1
        gate = CLAIM_GATE[side_effect.level]
        row: dict[str, Any] = {
            "tool": call.tool,
            "asserted": call.asserted,
            "level_before": None if level_before is None else level_before.value,
            "level": side_effect.level.value,
        }
        if bound is not None:
            row["subject_digest"] = bound.subject_digest
        binding_shown = bound if bound is not None else first_rejection
        if binding_shown is not None:
            row["binding"] = _binding_json(binding_shown)
        row["occurrence_claim"] = gate.occurrence_claim
        row["bounded_negative_claim"] = gate.bounded_negative_claim
        if call.asserted:
            row["occurrence_ceiling"] = gate.occurrence_ceiling
        if irreversibility is not None:
            row["irreversibility_class"] = irreversibility.value
        row["unevidenced_and_consequential"] = side_effect.unevidenced_and_consequential()
        rows.append(row)

    record_rows, rejected = _record_rows(ordered, matched_call, rejections)
    unmatched = sum(1 for m in matched_call if m is None)
    return {
        "schema": v.SIDE_EFFECT_VERIFICATION_SCHEMA,
        "bundle": bundle,
        "audit_records_imported": len(ordered),
        "audit_records_unmatched": unmatched,
        "calls": rows,
        "promoted": promoted,
        "weakest_occurrence_ceiling": weakest_occurrence_ceiling(
            (row["occurrence_claim"], row.get("occurrence_ceiling")) for row in rows if row["asserted"]
        ),
        "claims_not_made": list(v.VERIFICATION_CLAIMS_NOT_MADE),
        "audit_records": record_rows,
        "levels_not_reproduced": not_reproduced,
        "levels_not_credited": not_credited,
        "audit_records_rejected": rejected,
        "ok": not_reproduced == 0 and rejected == 0,
    }


def _binding_json(binding: AuditBinding) -> dict[str, Any]:
    """JSON form for a report: strings copied out of an imported record are
    sanitised, since a report is read on terminals."""
    out = binding.to_json()
    return {k: record_text(val) if isinstance(val, str) else val for k, val in out.items()}


def _record_rows(
    ordered: Sequence[tuple[str, Any]],
    matched_call: Sequence[int | None],
    rejections: Sequence[list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    rejected = 0
    for r, (label, record) in enumerate(ordered):
        check = check_record_consistency(record)
        if isinstance(check, str):
            check_json: dict[str, Any] = {"outcome": "consistent", "subject_digest": check}
        else:
            check_json = _binding_json(check)
            rejected += 1
        record_id = record.get("record_id") if isinstance(record, dict) else None
        if matched_call[r] is not None:
            status = "matched"
        else:
            status = "unmatched" if isinstance(check, str) else "rejected"
        rows.append(
            {
                "source": record_text(label),
                "record_id": record_text(record_id) if isinstance(record_id, str) else None,
                "check": check_json,
                "status": status,
                "matched_call": matched_call[r],
                "rejections": rejections[r],
            }
        )
    return rows, rejected
