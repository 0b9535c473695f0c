"""Assay evidence bundles (v1): events, content hashes, run root, manifest, and the integrity check.

Invariant: for the same events, ``manifest.json``, ``events.ndjson`` and the tar stream are byte for
byte what Assay's ``BundleWriter`` writes (auditor-evidence.md 1.2 to 1.5), and ``verify_bundle``
applies the rules of ``assay evidence verify`` in its order (1.6), so a bundle one accepts the other
accepts. The manifest and every event line are read as Assay's strict JSON (``canonical.strict``):
UTF-8 only, no BOM, no duplicate key at any depth, no lone surrogate, depth at most 64, at most 10,000
keys in an object, strings of at most 1 MiB characters. An event line is ``JCS(event) + "\\n"``; ``assaycontenthash`` is
``sha256(JCS({specversion, type, datacontenttype, subject?, data}))`` over the event's own values
(its ``datacontenttype`` as it stands, as Assay hashes it), which leaves out time, id,
source, run, seq and producer, so it is known the moment a record is made (the trace names it then);
``run_root`` is the SHA-256 of the content hashes each followed by ``\\n`` (a flat list, not a tree)
and ``bundle_id`` is the run root.

A bundle proves its own integrity, not its origin: a consistent rewrite of run id, ids, producer,
times and source keeps the run root (ADR-044); the archive's digest, signed in an attestation
(``dsse``), is what names the bytes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, canonical_bytes, sha256_prefixed
from drawbridge.canonical.strict import StrictJSONError, parse_strict_json
from drawbridge.evidence.bundle_archive import ArchiveError, gunzip, gzip_wrap, read_members, tar_stream

SPECVERSION: Final = "1.0"
CONTENT_TYPE: Final = "application/json"
ROOT_ALGORITHM: Final = 'sha256(concat(content_hash + "\\n"))'
ALGORITHMS: Final = {"canon": "jcs-rfc8785", "hash": "sha256", "root": ROOT_ALGORITHM}
MAX_LINE_BYTES: Final = 1024 * 1024
MAX_EVENTS: Final = 100_000
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


class BundleError(ValueError):
    """A bundle that cannot be written or does not verify; the message names the rule."""


def content_hash(
    event_type: str, data: Any, subject: str | None = None, datacontenttype: str = CONTENT_TYPE
) -> str:
    """``assaycontenthash`` of an event of ``event_type`` carrying ``data``: over the event's own
    ``datacontenttype``, as Assay's ``compute_content_hash`` (drawbridge writes ``application/json``)."""
    hashed: dict[str, Any] = {"specversion": SPECVERSION, "type": event_type, "datacontenttype": datacontenttype}
    if subject is not None:
        hashed["subject"] = subject
    hashed["data"] = data
    return sha256_prefixed(canonical_bytes(hashed))


def record_hash(event_type: str, data: Any) -> str | None:
    """``content_hash``, or None for a record with no canonical form (a lone surrogate): such a record
    cannot be a bundle event, and the trace names no hash for it."""
    try:
        return content_hash(event_type, data)
    except CanonicalizationError:
        return None


def content_hash_of_json(event_type: str, data_json: bytes) -> str:
    """``content_hash`` of data given as its JCS bytes (a record the writer has rendered already)."""
    return sha256_prefixed(
        b'{"data":' + data_json + b',"datacontenttype":"application/json","specversion":"1.0","type":'
        + canonical_bytes(event_type) + b"}"
    )


def run_root(content_hashes: Sequence[str]) -> str:
    return sha256_prefixed("".join(f"{h}\n" for h in content_hashes).encode("utf-8"))


def autosi_time(at: str) -> str:
    """A drawbridge timestamp (``...SS.ffffffZ``) as chrono's AutoSi renders it: no fraction, 3 or 6
    digits, the fewest that keep every non-zero digit."""
    head, dot, fraction = at.removesuffix("Z").partition(".")
    digits = fraction.rstrip("0")
    if not digits:
        return head + "Z"
    width = 3 if len(digits) <= 3 else 6 if len(digits) <= 6 else 9
    return f"{head}.{fraction.ljust(width, '0')[:width]}Z"


@dataclass(frozen=True)
class Producer:
    name: str
    version: str
    git: str | None = None

    def manifest(self) -> dict[str, str]:
        out = {"name": self.name, "version": self.version}
        if self.git is not None:
            out["git"] = self.git
        return out


def make_event(
    *, run_id: str, seq: int, source: str, producer: Producer, event_type: str, data: Any, time: str
) -> dict[str, Any]:
    """One CloudEvents 1.0 event with Assay's flattened extensions (no subject, no trace context)."""
    return {
        "specversion": SPECVERSION,
        "type": event_type,
        "source": source,
        "id": f"{run_id}:{seq}",
        "time": time,
        "datacontenttype": CONTENT_TYPE,
        "assayrunid": run_id,
        "assayseq": seq,
        "assayproducer": producer.name,
        "assayproducerversion": producer.version,
        "assaygit": producer.git if producer.git is not None else "unknown",
        "assaypii": False,
        "assaysecrets": False,
        "assaycontenthash": content_hash(event_type, data),
        "data": data,
    }


@dataclass(frozen=True)
class WrittenBundle:
    manifest: bytes
    events: bytes
    tar: bytes
    archive: bytes
    run_root: str


def write_bundle(events: Sequence[Mapping[str, Any]], producer: Producer | None = None) -> WrittenBundle:
    """The bundle of ``events`` (seq 0, 1, ... of one run and source), as Assay's writer lays it out."""
    if not events:
        raise BundleError("a bundle holds at least one event")
    first = events[0]
    for index, event in enumerate(events):
        if event["assayseq"] != index or event["assayrunid"] != first["assayrunid"]:
            raise BundleError(f"event {index} is not seq {index} of run {first['assayrunid']}")
        if event["source"] != first["source"] or event["id"] != f"{event['assayrunid']}:{index}":
            raise BundleError(f"event {index} has another source or a wrong id")
        if event["assaycontenthash"] != _event_hash(event):
            raise BundleError(f"event {index} has an inconsistent content hash")
    hashes = [str(event["assaycontenthash"]) for event in events]
    lines = b"".join(canonical_bytes(dict(event)) + b"\n" for event in events)
    root = run_root(hashes)
    if producer is None:
        git = first["assaygit"]
        producer = Producer(first["assayproducer"], first["assayproducerversion"], None if git == "unknown" else git)
    manifest = canonical_bytes({
        "schema_version": 1,
        "bundle_id": root,
        "producer": producer.manifest(),
        "run_id": first["assayrunid"],
        "event_count": len(events),
        "run_root": root,
        "algorithms": dict(ALGORITHMS),
        "files": {"events.ndjson": {"path": "events.ndjson", "sha256": sha256_prefixed(lines), "bytes": len(lines)}},
    })
    tar = tar_stream((("manifest.json", manifest), ("events.ndjson", lines)))
    return WrittenBundle(manifest, lines, tar, gzip_wrap(tar), root)


# --------------------------------------------------------------------------- verifying


@dataclass(frozen=True)
class VerifiedBundle:
    manifest: dict[str, Any]
    events: list[dict[str, Any]]
    tar: bytes
    members: dict[str, bytes]


def _event_hash(event: Mapping[str, Any]) -> str:
    return content_hash(event["type"], event["data"], event.get("subject"), event["datacontenttype"])


def _strict(data: bytes, what: str) -> Any:
    """Assay's strict JSON (auditor-evidence.md 1.6, ``canonical.strict``), a refusal naming ``what``."""
    try:
        return parse_strict_json(data)
    except StrictJSONError as exc:
        raise BundleError(f"{what} {exc}") from None


def _is_source(value: object) -> bool:
    return isinstance(value, str) and ":" in value and not value.startswith(":")


def _check_event(event: Any, index: int, manifest: Mapping[str, Any], source: Any) -> str:
    where = f"events.ndjson line {index + 1}"
    if not isinstance(event, dict):
        raise BundleError(f"{where} is not an event object")
    required = {"specversion": str, "type": str, "source": str, "id": str, "time": str, "datacontenttype": str,
                "assayrunid": str, "assayseq": int, "assayproducer": str, "assayproducerversion": str,
                "assaygit": str, "assaypii": bool, "assaysecrets": bool}
    for name, kind in required.items():
        value = event.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BundleError(f"{where}: {name} is missing or not a {kind.__name__}")
    if "data" not in event:
        raise BundleError(f"{where}: data is missing")
    if not _RFC3339.fullmatch(event["time"]):
        raise BundleError(f"{where}: time is not RFC 3339")
    if event["specversion"] != SPECVERSION:
        raise BundleError(f"{where}: specversion is not 1.0")
    if event.get("subject") is not None and not isinstance(event["subject"], str):
        raise BundleError(f"{where}: subject is not a string")
    recorded = event.get("assaycontenthash")
    computed = _event_hash(event)
    if recorded != computed:
        raise BundleError(f"{where}: assaycontenthash does not match the event's content")
    if event["assayseq"] != index:
        raise BundleError(f"{where}: seq {event['assayseq']} where {index} was expected")
    if event["assayrunid"] != manifest.get("run_id"):
        raise BundleError(f"{where}: run id is not the manifest's")
    if event["source"] != source or not _is_source(event["source"]):
        raise BundleError(f"{where}: source is not the first event's URI")
    if ":" in event["assayrunid"] or event["id"] != f"{event['assayrunid']}:{index}":
        raise BundleError(f"{where}: id is not <run_id>:<seq>")
    return computed


def verify_bundle(archive: bytes) -> VerifiedBundle:
    """``assay evidence verify``'s rules, in its order; ``BundleError`` naming the first broken one."""
    try:
        tar = gunzip(archive)
        members = read_members(tar)
    except ArchiveError as exc:
        raise BundleError(str(exc)) from None
    manifest = _strict(members["manifest.json"], "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("schema_version") != 1:
        raise BundleError("manifest.json is not a schema_version 1 manifest")
    for name in ("bundle_id", "run_id", "run_root"):
        if not isinstance(manifest.get(name), str):
            raise BundleError(f"manifest.json: {name} is missing")
    entry = manifest.get("files", {}).get("events.ndjson") if isinstance(manifest.get("files"), dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
        raise BundleError("manifest.json names no events.ndjson file")
    data = members["events.ndjson"]
    if len(data) != entry["bytes"]:
        raise BundleError("events.ndjson's size is not the manifest's")
    lines = data.split(b"\n")
    if lines[-1] != b"":
        raise BundleError("events.ndjson does not end with a newline")
    lines = lines[:-1]
    if len(lines) > MAX_EVENTS:
        raise BundleError(f"events.ndjson holds more than {MAX_EVENTS} events")
    events: list[dict[str, Any]] = []
    hashes: list[str] = []
    source: Any = None
    for index, raw in enumerate(lines):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if len(line) > MAX_LINE_BYTES:
            raise BundleError(f"events.ndjson line {index + 1} is longer than {MAX_LINE_BYTES} bytes")
        if not line.strip():
            raise BundleError(f"events.ndjson line {index + 1} is blank")
        event = _strict(line, f"events.ndjson line {index + 1}")
        if index == 0 and isinstance(event, dict):
            source = event.get("source")
        hashes.append(_check_event(event, index, manifest, source))
        events.append(event)
    expected = entry["sha256"] if entry["sha256"].startswith("sha256:") else "sha256:" + entry["sha256"]
    if sha256_prefixed(data) != expected:
        raise BundleError("events.ndjson's sha256 is not the manifest's")
    if not events:
        raise BundleError("the bundle holds no event")
    if manifest.get("event_count") != len(events):
        raise BundleError("the manifest's event_count is not the number of events")
    root = run_root(hashes)
    if manifest["run_root"] != root:
        raise BundleError("the manifest's run_root is not the root of the events' content hashes")
    if manifest["bundle_id"] != root:
        raise BundleError("the manifest's bundle_id is not its run root")
    return VerifiedBundle(manifest, events, tar, members)


def archive_digest(archive: bytes) -> str:
    return hashlib.sha256(archive).hexdigest()


__all__ = [
    "ALGORITHMS",
    "BundleError",
    "Producer",
    "VerifiedBundle",
    "WrittenBundle",
    "archive_digest",
    "autosi_time",
    "content_hash",
    "content_hash_of_json",
    "make_event",
    "record_hash",
    "run_root",
    "verify_bundle",
    "write_bundle",
]
