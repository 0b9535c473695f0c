"""The side-effect verifier of a whole surface document, and the claim gate its report applies.

Invariant: the report never claims more than the weakest evidence supports: each asserting call
takes at most one bound audit record and one record never vouches for two calls, not even when it is
imported twice (``audit_import.distinct_audit_records``: a copy counts once); an ``observed_confirmed``
restatement of a write is that write, not a call of its own, and never takes a record
(``observed_read.restated``); every imported record is reported with why it did or did not bind; a
recorded ``verification_subject_digest`` must be the one re-derived from the call; and the claim gate
(``CLAIM_GATE``) caps what a consumer may claim at each level. How an imported file is read, and
which files are records, is ``audit_import``'s.

Theory of operation (evidence-formats.md §3):

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

5. Restatements. A decision marked ``drawbridge.observed_read`` is the
   confirmation ``export`` adds: a write's decision restated at
   ``observed_confirmed``. It is paired with the decision it restates
   (``observed_read.restated``: equal but for the mark,
   ``response.side_effect_verified`` and the ladder fields of
   ``response.side_effect``; one-to-one), takes that call's re-derived
   level and ``restates`` its index, and is neither tried against a record nor
   folded into the weakest ceiling. A marked decision with no such twin still
   never takes a record, and is folded in at ``asserted``. Assay does not know
   the mark and counts a restatement as a call of its own.

6. Imported records are taken each once (``audit_import``): a copy is
   reported (status ``duplicate``, ``duplicate_of``) and never tried, and
   ``audit_records_imported`` counts it once.

7. Subject digests. A recorded ``verification_subject_digest`` (on
   ``observed_confirmed`` and ``verified``) is the binding digest of the
   call's own subject (evidence-formats.md §3.3: the bound record's digest, or
   the write's for a read follow-up). One that is not, or that sits on a call
   with no subject, is counted in ``levels_not_reproduced`` and shown as the
   row's ``recorded_subject_digest``. Assay's verifier reads no recorded level
   at all, so this check refuses nothing it accepts as a re-derivation.
"""


from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.audit_binding import (
    AuditBinding,
    Bound,
    binding_digest,
    check_record_consistency,
    promote_with_audit_record,
    subject_from_action,
)
from drawbridge.evidence.audit_import import distinct_audit_records
from drawbridge.evidence.classify import record_text
from drawbridge.evidence.observed_read import MARK, restated
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
#: coverage) pairs the ladder uses (evidence-formats.md §3.4 step 5).
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


@dataclass(frozen=True)
class SurfaceCall:
    """What the verifier reads from one decision entry, after its shape checks."""

    tool: str
    asserted: bool
    action: Any
    recorded: SideEffect | None
    recorded_verified_flag: bool | None
    marked: bool = False
    """The decision carries ``drawbridge.observed_read``: an ``observed_confirmed`` restatement."""


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
        marked=MARK in decision,
    )


def read_surface_calls(surface_doc: Any) -> list[SurfaceCall]:
    """Shape checks (evidence-formats.md §3.4 step 3), failing closed with the
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


def _subject_digest(action: Any) -> str | None:
    subject = subject_from_action(action)
    return binding_digest(subject) if subject is not None else None


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
    ``audit_import.load_audit_records``); they are tried in label order, each
    distinct record once (``audit_import.distinct_audit_records``). Returns the
    ``assay.side_effect_verification.v0`` report (fields of evidence-formats.md
    §3.4, ``bundle`` being the optional label of the surface document) plus:

    * per call, ``level_before`` (the level the document records; null when it
      has no ladder block), ``irreversibility_class`` when recorded,
      ``unevidenced_and_consequential`` for the re-derived level, ``restates``
      (the index of the call an ``observed_confirmed`` restatement restates)
      and ``recorded_subject_digest`` (a recorded digest that is not the
      call's), each only when it applies;
    * ``audit_records``: every record with ``source``, ``record_id``, its own
      consistency ``check``, ``status`` (matched / unmatched / rejected /
      duplicate), ``matched_call`` (index into ``calls``) and each
      ``rejections`` entry ``{call, binding}`` met while trying it; a
      duplicate names the copy kept in ``duplicate_of``;
    * ``audit_records_imported`` counts distinct records, duplicates once;
    * ``levels_not_reproduced``: calls whose recorded level (or legacy
      ``side_effect_verified: true``) is above what the evidence re-derives,
      or whose recorded ``verification_subject_digest`` is not the call's;
    * ``levels_not_credited``: calls recorded ``observed_confirmed`` by a read
      follow-up, which this verifier does not credit (module docstring);
    * ``audit_records_rejected``: records whose own check fails (no subject, no
      ``binding_digest``, not canonicalisable, or internally inconsistent);
    * ``ok``: no level is overclaimed and no imported record is rejected by its
      own check. Unmatched records do not make a run fail, and promoting
      nothing is still ok: ``asserted`` is an honest level and a missing
      export is the ordinary case.

    Raises :class:`SurfaceFormatError` on a document of the wrong shape, and
    ``AuditImportError`` on two different records under one identity.
    """
    calls = read_surface_calls(surface_doc)
    for pair in audit_records:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError("audit_records must be (source label, record) pairs")
    ordered, duplicates = distinct_audit_records(audit_records)
    restates = restated(surface_doc["observed_tool_decisions"])
    matched_call: list[int | None] = [None] * len(ordered)
    rejections: list[list[dict[str, Any]]] = [[] for _ in ordered]

    derived: list[tuple[SideEffect, Bound | None, AuditBinding | None]] = []
    for index, call in enumerate(calls):
        irreversibility = call.recorded.irreversibility_class if call.recorded is not None else None
        side_effect = SideEffect(asserted=call.asserted, irreversibility_class=irreversibility)
        first_rejection: AuditBinding | None = None
        bound: Bound | None = None
        if call.asserted and not call.marked:  # a restatement is its write: it never takes a record
            for r, (_label, record) in enumerate(ordered):
                if matched_call[r] is not None:
                    continue  # one record never vouches for two calls
                side_effect, binding = promote_with_audit_record(side_effect, record, call.action)
                if isinstance(binding, Bound):
                    bound = binding
                    matched_call[r] = index
                    break
                rejections[r].append({"call": index, "binding": _binding_json(binding)})
                if first_rejection is None:
                    first_rejection = binding
        derived.append((side_effect, bound, first_rejection))

    rows: list[dict[str, Any]] = []
    not_reproduced = not_credited = 0
    for index, call in enumerate(calls):
        twin = restates[index]
        side_effect, bound, first_rejection = derived[index]
        if twin is not None:  # the same call: its level is the one its write re-derives
            side_effect = derived[twin][0]
        irreversibility = side_effect.irreversibility_class
        level_before = _recorded_level(call)
        followup = (level_before is SideEffectLevel.OBSERVED_CONFIRMED and call.recorded is not None
                    and call.recorded.verification_source is VerificationSource.OBSERVED_READ_FOLLOWUP)
        recorded_digest = call.recorded.verification_subject_digest if call.recorded is not None else None
        digest_differs = recorded_digest is not None and recorded_digest != _subject_digest(call.action)
        if followup and side_effect.level.rank < level_before.rank and not digest_differs:  # type: ignore[union-attr]
            not_credited += 1  # sequence evidence in the run: reported, not credited, not an overclaim
        elif digest_differs or (level_before is not None and level_before.rank > side_effect.level.rank):
            not_reproduced += 1
        gate = CLAIM_GATE[side_effect.level]
        row: dict[str, Any] = {
            "tool": call.tool,
            "asserted": call.asserted,
            "level_before": None if level_before is None else level_before.value,
            "level": side_effect.level.value,
        }
        if twin is not None:
            row["restates"] = twin
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
        if digest_differs:
            row["recorded_subject_digest"] = record_text(str(recorded_digest))
        rows.append(row)

    record_rows, rejected = _record_rows(ordered, matched_call, rejections)
    record_rows += _duplicate_rows(duplicates)
    unmatched = sum(1 for m in matched_call if m is None)
    return {
        "schema": v.SIDE_EFFECT_VERIFICATION_SCHEMA,
        "bundle": bundle,
        "audit_records_imported": len(ordered),
        "audit_records_unmatched": unmatched,
        "calls": rows,
        "promoted": sum(1 for m in matched_call if m is not None),
        "weakest_occurrence_ceiling": weakest_occurrence_ceiling(
            (row["occurrence_claim"], row.get("occurrence_ceiling"))
            for row in rows if row["asserted"] and "restates" not in row
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


def _check_json(record: Any) -> tuple[dict[str, Any], bool]:
    """A record's own consistency check as a report shows it, and whether it holds."""
    check = check_record_consistency(record)
    if isinstance(check, str):
        return {"outcome": "consistent", "subject_digest": check}, True
    return _binding_json(check), False


def _record_row(label: str, record: Any, check: dict[str, Any], status: str, matched: int | None,
                rejections: list[dict[str, Any]]) -> dict[str, Any]:
    record_id = record.get("record_id") if isinstance(record, dict) else None
    return {
        "source": record_text(label),
        "record_id": record_text(record_id) if isinstance(record_id, str) else None,
        "check": check,
        "status": status,
        "matched_call": matched,
        "rejections": rejections,
    }


def _record_rows(
    ordered: Sequence[tuple[str, Any]],
    matched_call: Sequence[int | None],
    rejections: Sequence[list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    rejected = 0
    for r, (label, record) in enumerate(ordered):
        check, consistent = _check_json(record)
        rejected += not consistent
        status = "matched" if matched_call[r] is not None else "unmatched" if consistent else "rejected"
        rows.append(_record_row(label, record, check, status, matched_call[r], rejections[r]))
    return rows, rejected


def _duplicate_rows(duplicates: Sequence[tuple[str, Any, str]]) -> list[dict[str, Any]]:
    """A copy of a record imported before: listed, so that nothing vanishes, and never tried."""
    return [{**_record_row(label, record, _check_json(record)[0], "duplicate", None, []),
             "duplicate_of": record_text(kept)} for label, record, kept in duplicates]
