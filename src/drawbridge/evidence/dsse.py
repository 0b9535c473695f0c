"""In-toto statements in DSSE envelopes, Ed25519: the attestations of a bundle and of an auditor package.

Invariant: an envelope is Assay's (auditor-evidence.md 1.8): ``{"payload", "payloadType", "signatures":
[{"keyid", "sig"}]}`` written as ``json.dumps(indent=2)`` plus ``\\n``; the payload is
``JCS(statement)``, its type ``application/vnd.in-toto+json``; the signature is Ed25519 over the DSSE
PAE ``"DSSEv1 " len(type) " " type " " len(payload) " " payload``; the key id is ``sha256:`` + hex
SHA-256 of the key's SubjectPublicKeyInfo DER. Opening an envelope checks the payload type before the
signature, the first signature under the caller's trusted key (the key id is never trusted), then
that the payload is strict JSON and an in-toto v1 statement.

The bundle's statement is exactly Assay's ``evidence-bundle/v1`` (one subject: the bundle id and the
SHA-256 of the archive bytes; the predicate derived from the verified bundle), so
``verify_attestation_for_bundle`` accepts it; ``verify_bundle_attestation`` applies its rules. The
package's statement names every file of the package by its relative path and SHA-256, under a
predicate type drawbridge owns.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from drawbridge.canonical import CanonicalizationError, canonical_bytes, parse_json
from drawbridge.evidence.bundle import BundleError, VerifiedBundle, autosi_time, verify_bundle

PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
BUNDLE_PREDICATE: Final = "https://docs.getassay.dev/attestation/evidence-bundle/v1"
BUNDLE_PREDICATE_V0: Final = "https://docs.getassay.dev/attestation/evidence-bundle/v0"
EXPORT_PREDICATE: Final = "urn:drawbridge:attestation:evidence-export:v0"


class AttestationError(ValueError):
    """An envelope or statement that does not verify; the message names the rule."""


def keyid(key: Ed25519PublicKey) -> str:
    return "sha256:" + hashlib.sha256(key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign_statement(statement: Mapping[str, Any], key: Ed25519PrivateKey) -> bytes:
    """The envelope of ``statement``, as the file holds it."""
    payload = canonical_bytes(dict(statement))
    signature = key.sign(pae(PAYLOAD_TYPE, payload))
    envelope = {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(signature).decode("ascii")}],
    }
    return (json.dumps(envelope, indent=2) + "\n").encode("utf-8")


def open_envelope(envelope: bytes, key: Ed25519PublicKey) -> dict[str, Any]:
    """The statement of an envelope once its first signature verifies under ``key``."""
    try:
        document = parse_json(envelope)
    except (CanonicalizationError, UnicodeDecodeError):
        raise AttestationError("the envelope is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("payload"), str):
        raise AttestationError("the envelope has no payload")
    if document.get("payloadType") != PAYLOAD_TYPE:
        raise AttestationError(f"the envelope's payloadType is not {PAYLOAD_TYPE}")
    signatures = document.get("signatures")
    if not isinstance(signatures, list) or not signatures or not isinstance(signatures[0], dict):
        raise AttestationError("the envelope carries no signature")
    try:
        payload = base64.b64decode(document["payload"], validate=True)
        signature = base64.b64decode(str(signatures[0].get("sig")), validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError("the envelope's payload or signature is not base64") from None
    try:
        key.verify(signature, pae(PAYLOAD_TYPE, payload))
    except InvalidSignature:
        raise AttestationError("the envelope's signature does not verify under the trusted key") from None
    try:
        statement = parse_json(payload)
    except (CanonicalizationError, UnicodeDecodeError):
        raise AttestationError("the statement is not strict JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise AttestationError(f"the payload is not an in-toto statement ({STATEMENT_TYPE})")
    return statement


def envelope_bytes_are_canonical(envelope: bytes) -> bool:
    """Whether the file is exactly what ``sign_statement`` writes for its content, base64 included:
    no other spelling of the same envelope (whitespace, escapes, base64 padding bits) is accepted
    where every byte is meant to count."""
    try:
        document = parse_json(envelope)
        rendered = (json.dumps(document, indent=2) + "\n").encode("utf-8")
        payload = base64.b64decode(document["payload"], validate=True)
        signatures = document["signatures"]
        signature = base64.b64decode(signatures[0]["sig"], validate=True)
    except (CanonicalizationError, UnicodeError, KeyError, TypeError, IndexError, binascii.Error, ValueError):
        return False
    return (
        rendered == envelope
        and list(document) == ["payload", "payloadType", "signatures"]
        and len(signatures) == 1
        and list(signatures[0]) == ["keyid", "sig"]
        and base64.b64encode(payload).decode("ascii") == document["payload"]
        and base64.b64encode(signature).decode("ascii") == signatures[0]["sig"]
    )


def _instant(value: str) -> tuple[datetime, int]:
    head, _, fraction = value.removesuffix("Z").partition(".")
    return datetime.fromisoformat(head), int(fraction.ljust(9, "0")[:9] or "0")


def bundle_predicate(verified: VerifiedBundle) -> dict[str, Any]:
    """Assay's ``evidence-bundle/v1`` predicate of a verified bundle."""
    times = sorted((event["time"] for event in verified.events), key=_instant)
    producer = verified.manifest.get("producer") or {}
    return {
        "schema_version": 1,
        "semantic_equivalence": {"algorithm": "assay-run-root-v1", "value": verified.manifest["run_root"]},
        "run": {
            "run_id": verified.manifest["run_id"],
            "event_count": len(verified.events),
            "producer": {"name": producer.get("name"), "version": producer.get("version"),
                         "git": producer.get("git") or ""},
            "time_window": {"start": autosi_time(times[0]), "end": autosi_time(times[-1])},
        },
    }


def bundle_statement(archive: bytes) -> dict[str, Any]:
    """The statement Assay's ``attest`` makes for these archive bytes (they must verify)."""
    verified = verify_bundle(archive)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": verified.manifest["bundle_id"], "digest": {"sha256": hashlib.sha256(archive).hexdigest()}}],
        "predicateType": BUNDLE_PREDICATE,
        "predicate": bundle_predicate(verified),
    }


def verify_bundle_attestation(envelope: bytes, key: Ed25519PublicKey, archive: bytes) -> dict[str, Any]:
    """Assay's ``verify_attestation_for_bundle`` rules (ADR-044); the statement, or ``AttestationError``."""
    statement = open_envelope(envelope, key)
    if statement.get("predicateType") == BUNDLE_PREDICATE_V0:
        raise AttestationError("a v0 evidence-bundle statement names no artifact: refused")
    if statement.get("predicateType") != BUNDLE_PREDICATE:
        raise AttestationError(f"the predicate type is not {BUNDLE_PREDICATE}")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise AttestationError("the statement has not exactly one subject")
    digest = subjects[0].get("digest")
    if not isinstance(digest, dict) or set(digest) != {"sha256"}:
        raise AttestationError("the subject has not exactly one digest, sha256")
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict) or predicate.get("schema_version") != 1:
        raise AttestationError("the predicate's schema_version is not 1")
    try:
        verified = verify_bundle(archive)
    except BundleError as exc:
        raise AttestationError(f"the attested bundle does not verify: {exc}") from None
    if digest["sha256"] != hashlib.sha256(archive).hexdigest():
        raise AttestationError("the subject's sha256 is not the archive's")
    if subjects[0].get("name") != verified.manifest["bundle_id"]:
        raise AttestationError("the subject's name is not the bundle id")
    if predicate != bundle_predicate(verified):
        raise AttestationError("the predicate is not the one derived from the bundle")
    return statement


def export_statement(files: Mapping[str, bytes], predicate: Mapping[str, Any]) -> dict[str, Any]:
    """The package's statement: one subject per file (relative path, SHA-256), sorted by path."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": hashlib.sha256(files[name]).hexdigest()}}
                    for name in sorted(files)],
        "predicateType": EXPORT_PREDICATE,
        "predicate": dict(predicate),
    }


__all__ = [
    "BUNDLE_PREDICATE",
    "EXPORT_PREDICATE",
    "PAYLOAD_TYPE",
    "STATEMENT_TYPE",
    "AttestationError",
    "bundle_predicate",
    "bundle_statement",
    "envelope_bytes_are_canonical",
    "export_statement",
    "keyid",
    "open_envelope",
    "pae",
    "sign_statement",
    "verify_bundle_attestation",
]
