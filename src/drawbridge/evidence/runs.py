"""Runs in the trace: what one gateway process wrote, from its ``run_start`` entry to its ``run_end``.

Invariant: a run is sealed only when its ``run_end`` entry is in the trace and a signed checkpoint
covers that entry; a run without both (the process crashed, was killed, or its end was cut) is
"incomplete", never clean. A ``run_end`` that is not the open run's own (another run id, or a
``start_index`` other than the line of the open run's ``run_start``) ends that run as ``spliced``:
the writer never writes one, so its lines come from another trace or were moved. The trace file
holds the runs of every process that wrote it, one after the other; entries before the first
``run_start`` belong to no run.

Entry bodies: ``run_start`` ``{"run_id", "origin", "producer": {"name", "version"}}``, with
``"replica"`` (the replica id) when the gateway is one of several replicas on a shared state: the
entry format has no field to spare, so every entry names its replica through its run; ``run_end``
``{"run_id", "start_index"}`` (the index of its ``run_start``). A run id is what an Assay bundle
takes as ``run_id``: ``[A-Za-z0-9._-]``, 1 to 128 characters, no ``:``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drawbridge.canonical import CanonicalizationError, parse_json

RUN_START: Final = "run_start"
RUN_END: Final = "run_end"
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MARK = b'"kind":"run_'


def is_valid_run_id(value: object) -> bool:
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def run_start_body(
    run_id: str, origin: str | None, producer: Mapping[str, str], replica: str | None = None
) -> dict[str, Any]:
    if not is_valid_run_id(run_id):
        raise ValueError("a run id is 1 to 128 characters of [A-Za-z0-9._-]")
    body: dict[str, Any] = {"run_id": run_id, "origin": origin, "producer": dict(producer)}
    if replica is not None:
        body["replica"] = replica
    return body


def run_end_body(run_id: str, start_index: int) -> dict[str, Any]:
    return {"run_id": run_id, "start_index": start_index}


@dataclass(frozen=True)
class Run:
    run_id: str
    start_index: int
    end_index: int | None
    """The index of its ``run_end`` entry; None when the trace holds none."""
    last_index: int
    """The last entry of the run: its ``run_end`` (or the foreign one that ends it), else the entry
    before the next ``run_start``, else the last entry of the trace."""
    origin: Any = None
    """What its ``run_start`` names as ``origin`` (a string, as the gateway writes it)."""
    spliced: str | None = None
    """Why the ``run_end`` at ``last_index`` is not this run's own (None when it is, or there is none)."""

    def sealed(self, signed_size: int) -> bool:
        """Whether the run ended cleanly and a signed tree of ``signed_size`` leaves covers its end."""
        return self.spliced is None and self.end_index is not None and signed_size > self.end_index

    def unsealed_because(self, signed_size: int | None) -> str | None:
        """Why the run is not sealed under a verified signed tree of ``signed_size`` leaves (None: no
        checkpoint verified), or None when it is. Each cause is told as what it is: a run whose
        ``run_end`` is in the trace is never said to lack it when only the signature is missing."""
        if self.spliced is not None:
            return f"spliced: {self.spliced}"
        if self.end_index is None:
            return "incomplete: crash or cut (no run_end)"
        if signed_size is None:
            return (f"its run_end (line {self.end_index}) is in the trace, but no checkpoint verified, so "
                    "none covers it (see checkpoint)")
        if signed_size <= self.end_index:
            return (f"incomplete: its run_end (line {self.end_index}) is past the signed checkpoint "
                    f"({signed_size} lines)")
        return None


def _marked(index: int, line: bytes) -> tuple[str, Mapping[str, Any]] | None:
    if _MARK not in line:
        return None
    try:
        entry = parse_json(line)
    except CanonicalizationError:
        return None
    if not isinstance(entry, dict) or entry.get("kind") not in (RUN_START, RUN_END):
        return None
    body = entry.get("body")
    if not isinstance(body, dict) or not is_valid_run_id(body.get("run_id")):
        return None
    return entry["kind"], body


def runs_of(lines: Iterable[bytes]) -> list[Run]:
    """The runs of a trace given as its lines (index = line number from 0 = seq)."""
    runs: list[Run] = []
    open_run: tuple[str, int, Any] | None = None
    last = -1
    for index, line in enumerate(lines):
        last = index
        marked = _marked(index, line)
        if marked is None:
            continue
        kind, body = marked
        if kind == RUN_START:
            if open_run is not None:
                runs.append(Run(open_run[0], open_run[1], None, index - 1, open_run[2]))
            open_run = (body["run_id"], index, body.get("origin"))
        elif open_run is not None:
            run_id, start, origin = open_run
            if body["run_id"] == run_id and body.get("start_index") == start:
                runs.append(Run(run_id, start, index, index, origin))
            else:
                named = f"run {body['run_id']}" if body["run_id"] != run_id else \
                    f"start_index {body.get('start_index')}"
                why = (f"the run_end at line {index} names {named}, but this run started at line {start}: "
                       "its lines were spliced from another trace or moved")
                runs.append(Run(run_id, start, index, index, origin, why))
            open_run = None
    if open_run is not None:
        runs.append(Run(open_run[0], open_run[1], None, last, open_run[2]))
    return runs


def origins_of(lines: Iterable[bytes]) -> list[str]:
    """The origins the trace's runs name in their ``run_start`` entries, each once, in order: the
    origin a log keeps (a gateway refuses keys of another)."""
    origins: list[str] = []
    for index, line in enumerate(lines):
        marked = _marked(index, line)
        if marked is not None and marked[0] == RUN_START:
            origin = marked[1].get("origin")
            if isinstance(origin, str) and origin not in origins:
                origins.append(origin)
    return origins


__all__ = ["RUN_END", "RUN_START", "Run", "is_valid_run_id", "origins_of", "run_end_body", "run_start_body", "runs_of"]
