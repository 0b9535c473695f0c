"""Live evidence: what the gateway writes for every decision, before the agent is answered.

Invariant: every tools/call the pipeline decided on leaves exactly one entry in
the hash-chained trace and one tool-decision surface record, and, when the truth
producer is enabled, exactly one truth carrier; no raw argument value reaches
any of them. A recorder that cannot write raises, and the relay then fails closed.

Theory of operation. The relay hands the recorder one ``CallRecord`` per
tools/call and one ``RelayIncident`` per other problem. For a call, the
recorder builds (pure core, on the event loop) the trace body, the surface
record and the carrier, then hands all lines to one worker thread that writes
them (one ``os.write`` each, fsync per the configured policy), so an fsync
never stalls other calls. With ``fsync="batch"`` or ``"never"`` the writes are
done inline: they only reach the kernel's page cache and a thread hop would
cost more (``batch`` fsyncs once per 64 records).

Files in the evidence directory:

- ``trace.ndjson``: the hash chain (``drawbridge evidence verify-chain``);
- ``tool-decisions.ndjson``: one ``assay.tool_decision_surface.v0`` envelope per
  line, each holding one decision (``verify-side-effects`` reads the file whole);
- the truth carriers go to the file named by ``--tool-decision-truth-out``.

Argument digests in the trace are keyed (``hmac-sha256:<kid>:...``): with the
truth producer's key when it is configured, otherwise with a random key held in
memory for this process only (key id ``ephemeral-<8 hex>``), so digests
correlate calls within one run and cannot be brute-forced offline.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio.to_thread

from drawbridge.canonical import sanitize

from drawbridge.evidence.surface import build_decision, build_surface
from drawbridge.evidence.truth.carrier import args_digest, build_carrier
from drawbridge.evidence.truth.declared import declared_policy_digest
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.verdict import decision_verdict
from drawbridge.gateway.truth_key import TruthKey
from drawbridge.gateway.pipeline import CallRecord, Outcome, RelayEvent, RelayIncident
from drawbridge.state.append_only import AppendOnlyFile, FsyncPolicy
from drawbridge.state.trace_log import TraceLog

logger = logging.getLogger("drawbridge.evidence")

TRACE_FILE = "trace.ndjson"
SURFACE_FILE = "tool-decisions.ndjson"
MAX_REQUEST_ID_CHARS = 128


def ephemeral_key() -> TruthKey:
    return TruthKey(secrets.token_bytes(32), f"ephemeral-{secrets.token_hex(4)}")


def ndjson_line(record: Mapping[str, Any]) -> bytes:
    """One compact JSON line in the record's insertion order (evidence-formats.md 0.2: digests are
    always recomputed over JCS, so the line keeps the documented field order for readers)."""
    try:
        return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape rather than write invalid UTF-8
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# The surface record's (effect, status) for each way a decided call ends (evidence-formats.md 1.2:
# an allowed success asserts the side effect; a refusal is ("deny", "blocked")).
_EFFECT_STATUS: dict[Outcome, tuple[str, str]] = {
    Outcome.OK: ("allow", "success"),
    Outcome.TOOL_ERROR: ("allow", "tool_error"),
    Outcome.INPUT_REQUIRED: ("allow", "input_required"),
    Outcome.UPSTREAM_ERROR: ("error", "upstream_error"),
    Outcome.TIMEOUT: ("error", "timeout"),
    Outcome.UPSTREAM_EXITED: ("error", "upstream_exited"),
    Outcome.CANCELLED: ("error", "cancelled"),
    Outcome.REFUSED: ("deny", "blocked"),
    Outcome.APPROVAL_UNAVAILABLE: ("deny", "blocked"),
    Outcome.INVALID: ("error", "invalid_request"),
}


def effect_status(outcome: Outcome) -> tuple[str, str]:
    return _EFFECT_STATUS[outcome]


def _request_id_text(request_id: Any) -> str | None:
    if isinstance(request_id, bool) or request_id is None:
        return None
    if isinstance(request_id, int):
        return str(request_id)
    if isinstance(request_id, str):
        return sanitize(request_id[:MAX_REQUEST_ID_CHARS])
    return None


def truth_call_id(record: CallRecord) -> str:
    """``arguments._meta.tool_call_id`` if a string, else ``req_<id>``, else a fresh ``gen_<uuid>`` (2.10)."""
    call = record.call
    if call is not None:
        meta = call.arguments.get("_meta") if isinstance(call.arguments, Mapping) else None
        if isinstance(meta, Mapping) and isinstance(meta.get("tool_call_id"), str):
            return meta["tool_call_id"]
    request_id = record.request_id
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        return f"req_{request_id}"
    return f"gen_{uuid.uuid4()}"


Route = Callable[[str], str]
"""Downstream tool name -> the id of the upstream server that serves it (surface ``server.id``)."""


class EvidenceRecorder:
    """Writes the trace, the surface records and (optionally) truth carriers. See the module docstring."""

    def __init__(
        self,
        evidence_dir: str | Path | None,
        *,
        route: Route,
        truth_out: str | Path | None = None,
        truth_key: TruthKey | None = None,
        declared: Callable[[str], Mapping[str, Any]] | None = None,
        fsync: FsyncPolicy = "always",
        clock: Callable[[], str] = utc_now,
    ) -> None:
        if truth_out is not None and (truth_key is None or declared is None):
            raise ValueError("the truth producer needs a key and a declared contract")
        if evidence_dir is None and truth_out is None:
            raise ValueError("nothing to record: give an evidence directory, a truth sink, or both")
        self._trace: TraceLog | None = None
        self._surface: AppendOnlyFile | None = None
        self._truth: AppendOnlyFile | None = None
        try:
            if evidence_dir is not None:
                directory = Path(evidence_dir)
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._trace = TraceLog(directory / TRACE_FILE, fsync)
                self._surface = AppendOnlyFile(directory / SURFACE_FILE, fsync, what="surface record file")
            if truth_out is not None:
                self._truth = AppendOnlyFile(truth_out, fsync, what="tool-decision truth sink")
        except BaseException:
            self.close()
            raise
        # Only "always" fsyncs on every record; that is the one setting whose writes leave the
        # event loop. Otherwise a write reaches the page cache in microseconds (and "batch" pays
        # one fsync per 64 records inline), cheaper than a thread hop per call.
        self._inline = fsync != "always"
        self._route = route
        self._truth_key = truth_key
        self._digest_key = truth_key if truth_key is not None else ephemeral_key()
        self._declared = declared
        self._declared_cache: dict[str, tuple[Mapping[str, Any], str]] = {}
        self._clock = clock
        self._order = 0

    # ---------------------------------------------------------------- building (pure, on the loop)

    def _declared_for(self, agent: str) -> tuple[Mapping[str, Any], str]:
        assert self._declared is not None
        contract = self._declared(agent)
        cached = self._declared_cache.get(agent)
        if cached is None or cached[0] is not contract:
            cached = (contract, declared_policy_digest(dict(contract)))
            self._declared_cache[agent] = cached
        return cached

    def _call_lines(self, record: CallRecord) -> tuple[str, dict[str, Any], bytes | None, bytes | None]:
        arguments = record.call.arguments if record.call is not None else None
        carrier = None
        if self._truth is not None and record.action is not None and record.call is not None:
            carrier = self._carrier(record)
        if carrier is not None:  # same key: the carrier's digest is the trace's
            digest: str | None = carrier["args_digest"]
        elif record.call is not None:
            digest = args_digest(arguments, self._digest_key.key, self._digest_key.key_id)
        else:
            digest = None
        provenance = record.provenance
        body: dict[str, Any] = {
            "agent": sanitize(record.agent),
            "tool": record.tool,
            "request_id": _request_id_text(record.request_id),
            "action": record.action.value if record.action is not None else None,
            "policy": sanitize(provenance.policy) if provenance and provenance.policy else None,
            "source_file": provenance.source_file if provenance else None,
            "rule_index": provenance.rule_index if provenance else None,
            "reason": sanitize(record.reason) if record.reason is not None else None,
            "args_digest": digest,
            "outcome": record.outcome.value,
            "error": sanitize(record.error) if record.error is not None else None,
            "error_code": record.error_code,
            "decision_ms": round(record.decision_ms, 3) if record.decision_ms is not None else None,
            "latency_ms": round(record.latency_ms, 3),
            "protocol_version": record.protocol_version,
        }
        surface_line = None
        if record.tool is not None and self._surface is not None:
            effect, status = effect_status(record.outcome)
            rule_id = None
            if provenance is not None and provenance.policy is not None:
                rule_id = provenance.policy if provenance.rule_index is None else f"{provenance.policy}#{provenance.rule_index}"
            decision = build_decision(
                server_id=self._route(record.tool),
                tool_name=record.tool,
                arguments=arguments,
                params={"_meta": dict(record.call.meta)} if record.call and record.call.meta else {},
                effect=effect,
                status=status,
                rule_id=rule_id,
            )
            surface_line = ndjson_line(build_surface([decision]))
        return "tool_decision", body, surface_line, ndjson_line(carrier) if carrier is not None else None

    def _carrier(self, record: CallRecord) -> dict[str, Any]:
        assert self._truth_key is not None and record.call is not None
        order = self._order
        self._order += 1
        contract, dpd = self._declared_for(record.agent)
        identity = "present" if record.tool_listed else "absent"
        # The gateway does not yet observe class, scope or redaction, and no approval is obtained
        # (human_approval is refused): those axes stay "incomplete", never a guessed match.
        verdict = decision_verdict(dict(contract), record.call.tool, record.call.arguments, identity, Evidence())
        return build_carrier(
            tool_name=record.call.tool,
            args=record.call.arguments,
            order=order,
            declared_policy_digest=dpd,
            key=self._truth_key.key,
            key_id=self._truth_key.key_id,
            source_class="authoritative_boundary",
            call_id=truth_call_id(record),
            result_status="ok",
            identity_state=identity,
            decision_verdict=verdict,
        )

    # ---------------------------------------------------------------- writing

    def _write(self, kind: str, at: str, body: dict[str, Any], surface: bytes | None, carrier: bytes | None) -> None:
        if self._trace is not None:
            self._trace.append(kind, at, body)
        if surface is not None and self._surface is not None:
            self._surface.append_line(surface, "a surface record")
        if carrier is not None and self._truth is not None:
            self._truth.append_line(carrier, "a truth carrier")

    async def __call__(self, event: RelayEvent) -> None:
        at = self._clock()
        if isinstance(event, RelayIncident):
            body = {"kind": event.kind, "direction": event.direction, "detail": sanitize(event.detail),
                    "code": event.code}
            lines: tuple[str, dict[str, Any], bytes | None, bytes | None] = ("relay_incident", body, None, None)
        else:
            lines = self._call_lines(event)
        if self._inline:
            self._write(lines[0], at, lines[1], lines[2], lines[3])
        else:
            await anyio.to_thread.run_sync(self._write, lines[0], at, lines[1], lines[2], lines[3])

    async def record_event(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A trace entry that is not a call (policy edit, pin accept, approval, grant)."""
        if self._trace is None:
            return None
        at = self._clock()
        if self._inline:
            return self._trace.append(kind, at, body)
        return await self._trace.append_async(kind, at, body)

    def close(self) -> None:
        for sink in (self._trace, self._surface, self._truth):
            if sink is not None:
                sink.close()


__all__ = ["EvidenceRecorder", "TruthKey", "effect_status", "ephemeral_key", "truth_call_id", "utc_now"]
