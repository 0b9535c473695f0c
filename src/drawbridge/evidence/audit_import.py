"""Imported provider audit records: how a file is read, which files are records, and each record once.

Invariant: an imported audit file is read as Assay's strict JSON (``canonical.strict``: UTF-8 without a
byte order mark, each key once, nesting at most 64 levels). One that is not is never read as "no
record": it fails (``AuditImportError``, naming the file and the rule), in ``verify-side-effects``,
``export`` and ``verify-export`` alike. Assay skips it as not JSON, so neither tool promotes a call
through it; reading it here by ``json.loads``'s guesses (UTF-16, a skipped byte order mark, the last of
two equal keys) would give one file two verdicts. An auditor package holds only records consistent in
themselves (``package_audit_record``).

One record never vouches for two calls, not even when it is imported twice
(``distinct_audit_records``). A record's identity is its ``provider`` and ``record_id`` when
``record_id`` is a string, else its canonical (JCS) content. Records are taken in label order; a later
one with the identity and the canonical content of an earlier one is a copy (reported, counted once,
never tried), and a later one with the identity but other content is one provider entry saying two
things: refused, naming both files. Two records of one subject under different ``record_id`` values are
two provider entries, and each may verify a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes
from drawbridge.canonical.strict import StrictJSONError, parse_strict_json
from drawbridge.evidence import vocabulary as v
from drawbridge.evidence.audit_binding import check_record_consistency
from drawbridge.evidence.classify import record_text


class AuditImportError(ValueError):
    """An imported audit file that cannot be taken as evidence; the message names the file."""


def parse_audit_file(label: str, data: bytes) -> Any:
    """The JSON of one imported audit file, read as Assay's strict JSON: a record read here that Assay's
    reader skips (UTF-16, a byte order mark) or reads otherwise (a key given twice) would give one file
    two verdicts. A file that is not fails closed: skipping it could hide a record an auditor meant to
    import, and a package could not be checked again from it."""
    try:
        return parse_strict_json(data)
    except StrictJSONError as exc:
        raise AuditImportError(f"{record_text(label)} {exc}") from None


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


_MAX_ID_IN_ERROR: Final = 80


def _shown_id(record_id: str) -> str:
    shown = record_text(record_id)
    return repr(shown if len(shown) <= _MAX_ID_IN_ERROR else shown[:_MAX_ID_IN_ERROR] + "...")


def _content(record: Any) -> bytes | None:
    try:
        return canonical_bytes(record)
    except (CanonicalizationError, RecursionError):
        return None


def distinct_audit_records(
    records: Sequence[tuple[str, Any]],
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any, str]]]:
    """Each record once, in label order (module docstring): ``(kept, duplicates)``, a duplicate being
    ``(label, record, label of the copy kept)``. Two records that share a provider and ``record_id`` but
    not their content are one provider entry saying two things: ``AuditImportError`` naming both."""
    kept: list[tuple[str, Any]] = []
    duplicates: list[tuple[str, Any, str]] = []
    by_identity: dict[Any, tuple[str, bytes | None]] = {}
    for label, record in sorted(records, key=lambda pair: pair[0]):
        content = _content(record)
        record_id = record.get("record_id") if isinstance(record, dict) else None
        if isinstance(record_id, str):
            provider = record.get("provider")
            identity: Any = ("record_id", provider if isinstance(provider, str) else None, record_id)
        else:
            identity = ("content", content) if content is not None else ("label", label)
        first = by_identity.get(identity)
        if first is None:
            by_identity[identity] = (label, content)
            kept.append((label, record))
        elif identity[0] != "record_id" or (content is not None and content == first[1]):
            duplicates.append((label, record, first[0]))
        else:
            raise AuditImportError(
                f"{record_text(first[0])} and {record_text(label)} both hold record_id {_shown_id(record_id)}"
                f" of provider {_shown_id(identity[1] or '(none)')} with different content: one provider"
                " record cannot say two things"
            )
    return kept, duplicates


__all__ = [
    "AuditImportError",
    "describe_rejection",
    "distinct_audit_records",
    "load_audit_records",
    "package_audit_record",
    "parse_audit_file",
]
