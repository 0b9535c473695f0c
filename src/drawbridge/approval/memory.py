"""Approval memory: when earlier human decisions may stand in for a new one.

Invariant: memory only ever turns a pending ``human_approval`` into an
approval, and only when all of these hold for the exact (agent, tool, memory
key): memory is enabled (it is off unless configured); at least
``min_approvals`` approvals came from operators (client answers count only when
``count_client_answers`` is configured: they prove only that the client
answered); there has been no denial at all, through any channel; and the
current call's arguments do not look like injected instructions. The memory key
is the argument shape's digest, or, for a rule with ``memory_key``, a keyed
digest of that shape and the values of the named fields (``memory_key_digest``),
so "the same kind of call" can mean "the same path" and not only "a path".
Anything else, including a call whose argument shape could not be computed,
goes to a person. Memory never denies and never overrides a deny. The gateway
never consults it for a generic tool (its argument is the program), a changed
pin or an ``approval: operator`` rule.

Theory of operation. The approval store counts past resolutions for the key
(``ApprovalStore.memory_counts``) by feeding its (status, channel) rows to
``tally``. ``decide`` is a pure function of the configuration, those counts
and the injection flag, and returns the decision with a reason fit for the
trace chain. Auto-approvals (channel ``memory``) are counted apart and never
towards the threshold, so memory cannot feed itself. Expirations (timeout,
restart) are counted and reported but are not denials: nobody judged the call.
Unlike mesh7 (gateway-behaviour.md 3.9), which searched a memory server for
"<tool> <agent>" and counted lines from the top ten hits, the count here is an
exact query over the local approval table, scoped to the argument shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.approval.channels import Strength, strength_of
from drawbridge.canonical import CanonicalizationError, canonical_bytes, hmac_sha256_hex, is_valid_key_id

DEFAULT_MIN_APPROVALS: Final = 3
MEMORY_KEY_DOMAIN: Final = "drawbridge.approval_memory.v1"
MEMORY_RESOLVER: Final = "memory"
"""``resolved_by`` of an approval that memory granted."""


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How approval memory behaves. ``enabled=False`` switches it off entirely."""

    enabled: bool = False
    min_approvals: int = DEFAULT_MIN_APPROVALS
    count_client_answers: bool = False
    """Whether in-band elicitation answers (which prove only that the client answered) count as approvals."""

    def __post_init__(self) -> None:
        if isinstance(self.min_approvals, bool) or not isinstance(self.min_approvals, int):
            raise ValueError("memory min_approvals must be an integer")
        if self.min_approvals < 1:
            raise ValueError(f"memory min_approvals must be at least 1, not {self.min_approvals}")


@dataclass(frozen=True, slots=True)
class MemoryCounts:
    """Past resolutions for one (agent, tool, shape digest)."""

    operator_approvals: int = 0
    client_approvals: int = 0
    memory_approvals: int = 0
    denials: int = 0
    expirations: int = 0


@dataclass(frozen=True, slots=True)
class MemoryDecision:
    auto_approve: bool
    reason: str


def memory_key_digest(
    shape_digest: str, arguments: Mapping[str, Any], paths: Sequence[Sequence[str]], key: bytes, key_id: str
) -> str | None:
    """The memory key of a call under a rule's ``memory_key``: HMAC-SHA256 (domain
    ``drawbridge.approval_memory.v1``) over the canonical bytes of the shape digest and, per named
    path, whether it is present and its value. Keyed, so no value can be recovered from the stored
    digest; None when it cannot be computed (memory then does not apply)."""
    if not paths or not isinstance(key, (bytes, bytearray)) or not key or not is_valid_key_id(key_id):
        return None
    fields: list[Any] = []
    for path in paths:
        value: Any = arguments
        for part in path:
            if not isinstance(value, Mapping) or part not in value:
                fields.append([".".join(path), False, None])
                break
            value = value[part]
        else:
            fields.append([".".join(path), True, value])
    try:
        canonical = canonical_bytes({"shape": shape_digest, "fields": fields})
    except (CanonicalizationError, TypeError, ValueError, RecursionError):
        return None
    preimage = f"{MEMORY_KEY_DOMAIN}:{key_id}:".encode("ascii") + canonical
    return f"hmac-sha256:{key_id}:{hmac_sha256_hex(bytes(key), preimage)}"


def tally(rows: Iterable[tuple[str, str | None, int]]) -> MemoryCounts:
    """Count ``(status, channel, count)`` rows. Pending rows are ignored.

    An approval through a channel this version does not know counts for nothing: a row written by a
    newer drawbridge must not make this one approve on its behalf.
    """
    operator = client = memory = denials = expirations = 0
    for status, channel, count in rows:
        if status == "denied":
            denials += count
        elif status == "expired":
            expirations += count
        elif status == "approved":
            try:
                strength = strength_of(channel) if channel is not None else None
            except (ValueError, KeyError):
                strength = None
            if strength is Strength.OPERATOR:
                operator += count
            elif strength is Strength.CLIENT:
                client += count
            elif strength is Strength.MEMORY:
                memory += count
    return MemoryCounts(operator, client, memory, denials, expirations)


def decide(config: MemoryConfig, counts: MemoryCounts | None, *, injection_suspected: bool) -> MemoryDecision:
    """Whether memory approves this call. ``counts`` is None when the call has no argument shape."""
    if not config.enabled:
        return MemoryDecision(False, "approval memory is off")
    if injection_suspected:
        return MemoryDecision(False, "approval memory skipped: the arguments look like injected instructions")
    if counts is None:
        return MemoryDecision(False, "approval memory skipped: the argument shape could not be computed")
    if counts.denials:
        plural = "denial" if counts.denials == 1 else "denials"
        return MemoryDecision(
            False,
            f"approval memory: {counts.denials} {plural} on record for this agent, tool and argument shape",
        )
    approvals = counts.operator_approvals + (counts.client_approvals if config.count_client_answers else 0)
    if approvals < config.min_approvals:
        return MemoryDecision(
            False,
            f"approval memory: {approvals} of {config.min_approvals} approvals needed for this agent, tool "
            "and argument shape",
        )
    return MemoryDecision(
        True,
        f"approval memory: {approvals} prior approvals, 0 denials for this agent, tool and argument shape",
    )


__all__ = [
    "DEFAULT_MIN_APPROVALS",
    "MEMORY_KEY_DOMAIN",
    "MEMORY_RESOLVER",
    "MemoryConfig",
    "MemoryCounts",
    "MemoryDecision",
    "decide",
    "memory_key_digest",
    "tally",
]
