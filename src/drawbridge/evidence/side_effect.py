"""Side-effect receipt: the honesty ladder, audit-record binding, and the verifier.

Invariant: a side effect is never promoted past what its evidence supports.
Every record leaves the producer at ``asserted`` (the tool said so). A higher
rung is reached only through the evidence its row names, and the block always
says which:

====================  ============================  ==============================
level                 reached by                    verification_source
====================  ============================  ==============================
asserted              the producer, always          (omitted)
observed_confirmed    a later read of the same      observed_read_followup
                      target in the same run
verified              an imported provider audit    provider_audit_import
                      record that binds to the call
====================  ============================  ==============================

``verified`` never means "drawbridge queried the provider". It means an
independently produced ``assay.provider_audit_record.v0``, whose binding is
recomputed here from committed bytes, matches the observed call. Nothing in
this module opens a socket or holds a provider credential.

Theory of operation (evidence-formats.md 3):

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

   Assay itself projects only github deploy keys (evidence-formats.md 7.2
   item 5); the two new subjects let every classified category reach
   ``verified``. Widening a table row changes every binding of that class.

3. Irreversibility. Each classified category is ``one_way_consequential``; an
   unclassified tool has no class (unknown, never ``two_way``: defaulting to
   the cheapest class would let an unclassified terminal action read as
   harmless). ``unevidenced_and_consequential`` is the one question this axis
   answers: an effect was asserted, is still only ``asserted``, and its class
   demands evidence. (Assay also answers yes for a call that asserted
   nothing, such as a denied one; here that is no finding.)

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
   ``observed_confirmed``: a read follow-up needs a read classifier, and the
   classifiers only know writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, is_sha256_digest, jcs_digest
from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.classify import record_text

# --- the ladder -----------------------------------------------------------------


class SideEffectLevel(StrEnum):
    """How far past "the tool said success" the evidence reaches."""

    ASSERTED = v.LEVEL_ASSERTED
    OBSERVED_CONFIRMED = v.LEVEL_OBSERVED_CONFIRMED
    VERIFIED = v.LEVEL_VERIFIED

    @property
    def rank(self) -> int:
        return v.SIDE_EFFECT_LEVELS.index(self.value)


class VerificationSource(StrEnum):
    OBSERVED_READ_FOLLOWUP = v.SOURCE_OBSERVED_READ_FOLLOWUP
    PROVIDER_AUDIT_IMPORT = v.SOURCE_PROVIDER_AUDIT_IMPORT


class IrreversibilityClass(StrEnum):
    """How much the world minds if the effect happened when it should not have.
    A consequence scale, orthogonal to any authorisation lattice."""

    TWO_WAY = "two_way"
    ONE_WAY_RECOVERABLE = "one_way_recoverable"
    ONE_WAY_CONSEQUENTIAL = "one_way_consequential"
    ONE_WAY_TERMINAL = "one_way_terminal"

    @property
    def rank(self) -> int:
        return v.IRREVERSIBILITY_CLASSES.index(self.value)

    def demands_evidence(self) -> bool:
        """An unproven claim about this effect is worth escalating."""
        return self.rank >= IrreversibilityClass.ONE_WAY_CONSEQUENTIAL.rank


#: Consequence class per category. Every category with a required scope has one.
IRREVERSIBILITY_BY_CATEGORY: Final = {
    v.GITHUB_DEPLOY_KEY: IrreversibilityClass.ONE_WAY_CONSEQUENTIAL,  # standing repo access
    v.SLACK_ADD_MEMBER: IrreversibilityClass.ONE_WAY_CONSEQUENTIAL,  # history already seen
    v.WORKSPACE_ADMIN: IrreversibilityClass.ONE_WAY_CONSEQUENTIAL,  # authority to change more
}


def irreversibility_for(category: str | None) -> IrreversibilityClass | None:
    """None for an unclassified tool: unknown consequence, never a cheap one."""
    return IRREVERSIBILITY_BY_CATEGORY.get(category) if category is not None else None


_SOURCE_FOR_LEVEL: Final = {
    SideEffectLevel.OBSERVED_CONFIRMED: VerificationSource.OBSERVED_READ_FOLLOWUP,
    SideEffectLevel.VERIFIED: VerificationSource.PROVIDER_AUDIT_IMPORT,
}


class SideEffectFormatError(ValueError):
    """A ``response.side_effect`` block that is not a well-formed ladder block."""


@dataclass(frozen=True)
class SideEffect:
    """The ``response.side_effect`` block.

    Construction checks the ladder's consistency, so no value of this type can
    claim a level without the evidence class and digest that earned it:
    ``asserted`` carries neither; each higher level carries its own source and
    a ``sha256:`` subject digest, and requires ``asserted`` to be true.
    """

    asserted: bool
    level: SideEffectLevel = SideEffectLevel.ASSERTED
    verification_source: VerificationSource | None = None
    verification_subject_digest: str | None = None
    irreversibility_class: IrreversibilityClass | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.asserted, bool):
            raise SideEffectFormatError("side_effect.asserted must be a boolean")
        for name, enum in (
            ("level", SideEffectLevel),
            ("verification_source", VerificationSource),
            ("irreversibility_class", IrreversibilityClass),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, enum):
                raise SideEffectFormatError(f"side_effect.{name} is not a {enum.__name__}")
        if self.level is SideEffectLevel.ASSERTED:
            if self.verification_source is not None or self.verification_subject_digest is not None:
                raise SideEffectFormatError("an asserted side effect carries no verification")
            return
        if not self.asserted:
            raise SideEffectFormatError(f"level {self.level.value} requires an asserted side effect")
        if self.verification_source is not _SOURCE_FOR_LEVEL[self.level]:
            raise SideEffectFormatError(
                f"level {self.level.value} requires verification_source "
                f"{_SOURCE_FOR_LEVEL[self.level].value}"
            )
        if not is_sha256_digest(self.verification_subject_digest):
            raise SideEffectFormatError(
                f"level {self.level.value} requires a sha256 verification_subject_digest"
            )

    @property
    def verified_flag(self) -> bool:
        """The compat ``side_effect_verified``: true for ``verified`` only;
        ``observed_confirmed`` is in-run sequence evidence, not verification."""
        return self.level is SideEffectLevel.VERIFIED

    def unevidenced_and_consequential(self) -> bool:
        """Still the tool's own word, and the effect's class demands more.
        An unknown class is False: missing metadata manufactures no finding.
        Unlike Assay, a call that asserted no effect (denied, failed) is False
        too: there is no claimed effect left unevidenced."""
        return (
            self.asserted
            and self.level is SideEffectLevel.ASSERTED
            and self.irreversibility_class is not None
            and self.irreversibility_class.demands_evidence()
        )

    def to_json(self) -> dict[str, Any]:
        """Wire form: ``asserted``, ``level``, then each optional field only
        when set (omitted, never null)."""
        out: dict[str, Any] = {"asserted": self.asserted, "level": self.level.value}
        if self.verification_source is not None:
            out["verification_source"] = self.verification_source.value
        if self.verification_subject_digest is not None:
            out["verification_subject_digest"] = self.verification_subject_digest
        if self.irreversibility_class is not None:
            out["irreversibility_class"] = self.irreversibility_class.value
        return out

    @classmethod
    def from_json(cls, block: Any) -> SideEffect:
        """Read a block; explicit nulls read as omitted (Assay's fixtures write them)."""
        if not isinstance(block, dict):
            raise SideEffectFormatError("side_effect is not a JSON object")
        asserted = block.get("asserted")
        if not isinstance(asserted, bool):
            raise SideEffectFormatError("side_effect.asserted must be a boolean")

        def member(name: str, enum: type[StrEnum], required: bool) -> Any:
            raw = block.get(name)
            if raw is None and not required:
                return None
            if not isinstance(raw, str) or raw not in {m.value for m in enum}:
                raise SideEffectFormatError(f"side_effect.{name} is not one of {[m.value for m in enum]}")
            return enum(raw)

        digest = block.get("verification_subject_digest")
        if digest is not None and not isinstance(digest, str):
            raise SideEffectFormatError("side_effect.verification_subject_digest must be a string")
        return cls(
            asserted=asserted,
            level=member("level", SideEffectLevel, True),
            verification_source=member("verification_source", VerificationSource, False),
            verification_subject_digest=digest,
            irreversibility_class=member("irreversibility_class", IrreversibilityClass, False),
        )


def producer_block(asserted: bool, category: str | None) -> SideEffect:
    """The only block a producer emits: level ``asserted``, with the category's
    consequence class attached (omitted for an unclassified tool)."""
    return SideEffect(asserted=asserted, irreversibility_class=irreversibility_for(category))


def _promoted(side_effect: SideEffect, level: SideEffectLevel, digest: str) -> SideEffect:
    return dataclasses.replace(
        side_effect,
        level=level,
        verification_source=_SOURCE_FOR_LEVEL[level],
        verification_subject_digest=digest,
    )


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
        return _promoted(side_effect, SideEffectLevel.VERIFIED, binding.subject_digest), binding
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
    return _promoted(side_effect, SideEffectLevel.OBSERVED_CONFIRMED, digest)


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
    not_reproduced = 0
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
        if level_before is not None and level_before.rank > side_effect.level.rank:
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
