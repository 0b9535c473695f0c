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

Theory of operation (evidence-formats.md §3): the ladder is here; a promotion past ``asserted``
comes only from ``audit_binding`` (a bound provider audit record) or a read follow-up, and the
verifier of a whole surface document is ``side_effect_verify``.

3. Irreversibility. Each classified category is ``one_way_consequential``; an
   unclassified tool has no class (unknown, never ``two_way``: defaulting to
   the cheapest class would let an unclassified terminal action read as
   harmless). ``unevidenced_and_consequential`` is the one question this axis
   answers: an effect was asserted, is still only ``asserted``, and its class
   demands evidence. (Assay also answers yes for a call that asserted
   nothing, such as a denied one; here that is no finding.)
"""


from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from drawbridge.canonical import is_sha256_digest
from drawbridge.evidence import vocabulary as v

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


def promoted(side_effect: SideEffect, level: SideEffectLevel, digest: str) -> SideEffect:
    return dataclasses.replace(
        side_effect,
        level=level,
        verification_source=_SOURCE_FOR_LEVEL[level],
        verification_subject_digest=digest,
    )
