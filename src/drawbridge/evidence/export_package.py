"""The events of one run, as the auditor package's Assay bundle holds them.

Invariant: the bundle of a run holds, in trace order, exactly the records its trace lines name by
content hash (each ``tool_decision`` entry's ``evidence``: the surface record, then the truth
carrier), then the confirmations a later read of the run makes of its writes (``observed_read``:
derived from the trace and the writes' records, recomputed by the verifier), then one recipe row per
carrier (``pack_recipe_row`` under the run's verdict over all its carriers), then, last, the signed
checkpoint that covers the run. So every bundle event but the
confirmations, the rows and the checkpoint is named by exactly one trace line of the run, and every record the run's trace
names is in the bundle: ``export_verify`` checks both directions.

Event rules (auditor-evidence.md 6.2): run id = the run's id (no ``:``); source
``urn:drawbridge:gateway:<origin>``, the same on every event; producer ``drawbridge`` and its
version, ``assaygit`` ``"unknown"``; no subject; ``time`` = the trace entry's ``at`` in AutoSi form.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, parse_json
from drawbridge.evidence.bundle import Producer, autosi_time, make_event
from drawbridge.evidence.observed_read import confirmations
from drawbridge.evidence.runs import Run
from drawbridge.evidence.tlog import Checkpoint
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA
from drawbridge.evidence.truth.pack import pack_recipe_row
from drawbridge.evidence.truth.verdict import run_verdict
from drawbridge.evidence.vocabulary import SURFACE_SCHEMA

RECIPE_ROW_TYPE: Final = "assay.tool_decision_truth.recipe_row.v0"
CHECKPOINT_EVENT: Final = "drawbridge.tlog_checkpoint.v0"
NAMED_TYPES: Final = (SURFACE_SCHEMA, CARRIER_SCHEMA)


class ExportError(ValueError):
    """A run that cannot be packaged as it stands; the message says what is missing or wrong."""


class ExportUsageError(ExportError):
    """What to export is not given right (no such run, a carrier file that is needed): a usage error."""


def source_of(origin: str) -> str:
    return f"urn:drawbridge:gateway:{origin}"


def named_records(lines: Sequence[bytes], run: Run) -> list[tuple[int, str, str, str]]:
    """``(trace index, at, type, content hash)`` of every record the run's trace lines name, in order."""
    named: list[tuple[int, str, str, str]] = []
    for index in range(run.start_index, run.last_index + 1):
        line = lines[index]
        if b'"evidence":[' not in line:
            continue
        try:
            entry = parse_json(line)
        except CanonicalizationError:
            raise ExportError(f"trace line {index} is not JSON") from None
        body = entry.get("body") if isinstance(entry, dict) else None
        items = body.get("evidence") if isinstance(body, dict) else None
        if entry.get("kind") != "tool_decision" or not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict) or item.get("type") not in NAMED_TYPES:
                raise ExportError(f"trace line {index} names a record of an unknown kind")
            named.append((index, entry["at"], item["type"], str(item.get("content_hash"))))
    return named


def checkpoint_event_data(checkpoint: Checkpoint, note: str, run: Run) -> dict[str, Any]:
    return {
        "schema": CHECKPOINT_EVENT,
        "origin": checkpoint.origin,
        "tree_size": checkpoint.size,
        "root_hash": base64.b64encode(checkpoint.root).decode("ascii"),
        "note": note,
        "covers": {"first_index": run.start_index, "last_index": run.last_index},
    }


@dataclass(frozen=True)
class RunEvents:
    events: list[dict[str, Any]]
    carriers: int
    surfaces: int


def run_events(
    lines: Sequence[bytes],
    run: Run,
    records: Mapping[tuple[str, str], Any],
    *,
    origin: str,
    producer: Producer,
    checkpoint: Checkpoint,
    note: str,
    at: str,
) -> RunEvents:
    """The bundle events of ``run``: ``records`` maps ``(type, content hash)`` to the record's data."""
    if checkpoint.size <= run.last_index:
        raise ExportError(f"the checkpoint signs {checkpoint.size} lines: it does not cover the run")
    source = source_of(origin)
    events: list[dict[str, Any]] = []

    def add(event_type: str, data: Any, time: str) -> dict[str, Any]:
        event = make_event(run_id=run.run_id, seq=len(events), source=source, producer=producer,
                           event_type=event_type, data=data, time=time)
        events.append(event)
        return event

    missing = []
    carriers: list[tuple[dict[str, Any], dict[str, Any]]] = []
    writes: list[tuple[int, Any]] = []
    surfaces = 0
    for index, entry_at, kind, digest in named_records(lines, run):
        data = records.get((kind, digest))
        if data is None:
            missing.append(f"line {index}: {kind} {digest}")
            continue
        event = add(kind, data, autosi_time(entry_at))
        if kind == CARRIER_SCHEMA:
            carriers.append((event, data))
        else:
            surfaces += 1
            writes.append((index, data))
    if missing:
        shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ExportError(f"the evidence lacks {len(missing)} record(s) the trace names ({shown})")
    for read_at, record in confirmations(lines, run, writes):
        add(SURFACE_SCHEMA, record, autosi_time(read_at))
    if carriers:
        verdicts = [data["decision_verdict"] for _event, data in carriers]
        verdict = run_verdict(verdicts, [data["order"] for _event, data in carriers])
        for event, data in carriers:
            row = pack_recipe_row(data, verdict, f"assay://evidence-event/{run.run_id}/{event['assayseq']}")
            add(RECIPE_ROW_TYPE, row, event["time"])
    add(CHECKPOINT_EVENT, checkpoint_event_data(checkpoint, note, run), autosi_time(at))
    return RunEvents(events, len(carriers), surfaces)


__all__ = [
    "CHECKPOINT_EVENT",
    "NAMED_TYPES",
    "RECIPE_ROW_TYPE",
    "ExportError",
    "ExportUsageError",
    "RunEvents",
    "checkpoint_event_data",
    "named_records",
    "run_events",
    "source_of",
]
