"""Live evidence: what the gateway writes for every decision, before the agent is answered.

Invariant: every tools/call the pipeline decided on leaves exactly one entry in
the hash-chained trace and one tool-decision surface record, and, when the truth
producer is enabled, exactly one truth carrier; no raw argument value reaches
any of them. A recorder that cannot write raises, and the relay then fails closed.

Theory of operation. The relay hands the recorder one ``CallRecord`` per
tools/call and one ``RelayIncident`` per other problem; the calls its upstream
answered in one read come together (``record_now``). For each, the recorder
builds (pure core, on the event loop) the trace body, the surface record and the
carrier, then writes the lines of them all with one ``os.write`` per file, on the
event loop: a write only reaches the kernel's page cache, in microseconds, less
than a hop to a worker thread would cost. Every record has reached the OS when
the call returns, so a crash of the gateway loses nothing that was answered.

Durability, the ``fsync`` setting (``"batch"`` by default, ``"always"``,
``"never"``): what each promises and how the fsyncs are done off the event loop
is in ``durability``, the recorder's base. The trace body and the carrier line
are rendered from cached segments around what changes per call (``segments``).

Files in the evidence directory:

- ``trace.ndjson``: the hash chain (``drawbridge evidence verify-chain``);
- ``tool-decisions.ndjson``: one ``assay.tool_decision_surface.v0`` envelope per
  line, each holding one decision (``verify-side-effects`` reads the file whole);
- ``checkpoint``, ``checkpoints.ndjson``: signed checkpoints of the trace (``checkpoints``);
- the truth carriers go to the file named by ``--tool-decision-truth-out``.

Argument digests in the trace are keyed (``hmac-sha256:<kid>:...``): with the truth producer's key
when it is on, else the configured digest key (``truth_key.digest_key_from_env``: digests match
across runs), else a random key held in memory for this process only (``ephemeral-<8 hex>``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from drawbridge.canonical import Canonical, canonical_bytes, sanitize
from drawbridge.evidence.bundle import content_hash_of_json, record_hash
from drawbridge.evidence.classify import UNKNOWN, classify
from drawbridge.evidence.observed_read import read_subject
from drawbridge.evidence.surface import build_decision, build_surface
from drawbridge.evidence.truth.carrier import SCHEMA as CARRIER_SCHEMA
from drawbridge.evidence.truth.carrier import args_digest, build_carrier, observed_input_digest
from drawbridge.evidence.truth.declared import declared_policy_digest
from drawbridge.evidence.truth.evidence import Evidence
from drawbridge.evidence.truth.prepared import PreparedPolicy, prepare_policy, prepared_decision_verdict
from drawbridge.evidence.vocabulary import SURFACE_SCHEMA
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent, RelayIncident
from drawbridge.gateway.pipeline.tool_call import ToolCall
from drawbridge.gateway.recording.durability import BATCH_LIMIT, BATCH_LINES, BATCH_SECONDS, Durability
from drawbridge.gateway.recording.clock import utc_now
from drawbridge.gateway.recording.segments import BODY_VARYING, body_join, body_segments, ndjson_line
from drawbridge.gateway.recording.segments import carrier_jcs_join, carrier_jcs_segments
from drawbridge.gateway.recording.segments import carrier_join, carrier_segments, carrier_texts
from drawbridge.gateway.recording.truth_key import TruthKey, ephemeral_key
from drawbridge.state.append_only import AppendOnlyFile, FsyncPolicy
from drawbridge.state.trace_log import TraceLog

TRACE_FILE = "trace.ndjson"
SURFACE_FILE = "tool-decisions.ndjson"
MAX_REQUEST_ID_CHARS = 128
SURFACE_CACHE_MAX = 1024
ADMITTED_MAX = 65536
"""Admitted calls whose digests wait for their records (a bound, in case a record never comes)."""


# The surface record's (effect, status) for each way a decided call ends (evidence-formats.md §1.2:
# an allowed success asserts the side effect; a refusal is ("deny", "blocked")).
_EFFECT_STATUS: dict[Outcome, tuple[str, str]] = {
    Outcome.OK: ("allow", "success"),
    Outcome.TOOL_ERROR: ("allow", "tool_error"),
    Outcome.INPUT_REQUIRED: ("allow", "input_required"),
    Outcome.TASK_CREATED: ("allow", "task_created"),
    Outcome.UPSTREAM_ERROR: ("error", "upstream_error"),
    Outcome.TIMEOUT: ("error", "timeout"),
    Outcome.UPSTREAM_EXITED: ("error", "upstream_exited"),
    Outcome.CANCELLED: ("error", "cancelled"),
    Outcome.REFUSED: ("deny", "blocked"),
    Outcome.APPROVAL_UNAVAILABLE: ("deny", "blocked"),
    Outcome.APPROVAL_PENDING: ("deny", "approval_pending"),
    Outcome.INVALID: ("error", "invalid_request"),
}


def effect_status(outcome: Outcome) -> tuple[str, str]:
    return _EFFECT_STATUS[outcome]


_UNOBSERVED = Evidence()
_APPROVED = Evidence(approval_obtained=True)


def approval_obtained(record: CallRecord) -> bool:
    """A person, a grant or approval memory approved this call (the gateway's approval block says so)."""
    approval = record.approval
    return approval is not None and approval.get("settled") == "allow" and approval.get("how") != "policy"


def _request_id_text(request_id: Any) -> str | None:
    if isinstance(request_id, bool) or request_id is None:
        return None
    if isinstance(request_id, int):
        return str(request_id)
    if isinstance(request_id, str):
        text = sanitize(request_id[:MAX_REQUEST_ID_CHARS])
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a call refused for it): U+FFFD, as for a control
            text = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
        return text
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


_Lines = tuple[str, Mapping[str, Any] | Canonical, bytes | None, bytes | None]
"""One event's records: the trace entry's kind and body, the surface line, the carrier line."""

Route = Callable[[str], str]
"""Downstream tool name -> the id of the upstream server that serves it (surface ``server.id``)."""


class EvidenceRecorder(Durability):
    """Writes the trace, the surface records and (optionally) truth carriers. See the module docstring
    (and ``durability``'s, for when the files are fsynced)."""

    def __init__(
        self,
        evidence_dir: str | Path | None,
        *,
        route: Route,
        truth_out: str | Path | None = None,
        truth_key: TruthKey | None = None,
        digest_key: TruthKey | None = None,
        declared: Callable[[str], Mapping[str, Any]] | None = None,
        fsync: FsyncPolicy = "batch",
        clock: Callable[[], str] = utc_now,
        batch_seconds: float = BATCH_SECONDS,
        batch_lines: int = BATCH_LINES,
        batch_limit: int = BATCH_LIMIT,
        replica: str | None = None,
    ) -> None:
        if truth_out is not None and (truth_key is None or declared is None):
            raise ValueError("the truth producer needs a key and a declared contract")
        if evidence_dir is None and truth_out is None:
            raise ValueError("nothing to record: give an evidence directory, a truth sink, or both")
        self._trace: TraceLog | None = None
        self._surface: AppendOnlyFile | None = None
        self._truth: AppendOnlyFile | None = None
        super().__init__(fsync, batch_seconds, batch_lines, batch_limit)
        file_fsync, batch_size = self._files_fsync()
        try:
            if evidence_dir is not None:
                directory = Path(evidence_dir)
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._trace = TraceLog(directory / TRACE_FILE, file_fsync, batch_size=batch_size, replica=replica)
                self._surface = AppendOnlyFile(
                    directory / SURFACE_FILE, file_fsync, batch_size=batch_size, what="surface record file"
                )
            if truth_out is not None:
                self._truth = AppendOnlyFile(
                    truth_out, file_fsync, batch_size=batch_size, what="tool-decision truth sink"
                )
            if self._managed:
                # fsync flushes the file, whichever descriptor it is given.
                sinks = ((self._trace, "trace log"), (self._surface, "surface record file"),
                         (self._truth, "tool-decision truth sink"))
                for index, (sink, what) in enumerate(sinks):
                    if sink is not None:
                        fd = os.open(sink.path, os.O_RDONLY | os.O_CLOEXEC)
                        self._sync_through(index, sink.path, fd, what)
            self._start_syncing()
        except BaseException:
            self.close()
            raise
        self._route = route
        self._truth_key = truth_key
        self._digest_key = truth_key or digest_key or ephemeral_key()
        self._admitted: dict[int, str] = {}
        """Argument digests of admitted calls not recorded yet, by the identity of their ``ToolCall``."""
        self._declared = declared
        self._declared_cache: dict[str, tuple[Mapping[str, Any], str, PreparedPolicy]] = {}
        self._clock = clock
        self._order = 0
        self._surface_cache: dict[tuple[str, str, str, str, str | None], tuple[bytes, str | None]] = {}
        self._body_segments: dict[tuple[Any, ...], tuple[bytes, ...]] = {}
        self._carrier_segments: dict[tuple[Any, ...], tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}

    # ---------------------------------------------------------------- building (pure, on the loop)

    def _declared_for(self, agent: str) -> tuple[Mapping[str, Any], str, PreparedPolicy]:
        """The agent's contract, its digest and its prepared reading, derived once per contract object
        (the provider returns the same object until the policy changes)."""
        assert self._declared is not None
        contract = self._declared(agent)
        cached = self._declared_cache.get(agent)
        if cached is None or cached[0] is not contract:
            cached = (contract, declared_policy_digest(dict(contract)), prepare_policy(dict(contract)))
            self._declared_cache[agent] = cached
        return cached

    def admit(self, call: ToolCall) -> str | None:
        """Why the record of this call could not be built, or None; asked before the call runs, so a
        call whose evidence cannot be made is refused instead of run. What it computes from the
        arguments (their keyed digest) is kept for the call's record."""
        digest = args_digest(call.arguments, self._digest_key.key, self._digest_key.key_id)
        if digest is None:
            return "its arguments have no canonical form"
        classify(call.tool, call.arguments)  # the surface record's projection of the arguments
        if len(self._admitted) >= ADMITTED_MAX:
            self._admitted.clear()  # only calls recorded without being admitted leave entries behind
        self._admitted[id(call)] = digest
        return None

    def _digest_of(self, call: ToolCall) -> str | None:
        """The call's argument digest: the one computed when it was admitted, else now."""
        digest = self._admitted.pop(id(call), None)
        if digest is None:
            digest = args_digest(call.arguments, self._digest_key.key, self._digest_key.key_id)
        return digest

    def _call_lines(self, record: CallRecord) -> _Lines:
        arguments = record.call.arguments if record.call is not None else None
        carrier_line = carrier_hash = None
        if self._truth is not None and record.action is not None and record.call is not None:
            # same key: the carrier's digest is the trace's
            carrier_line, digest, carrier_hash = self._carrier_line(record)
        elif record.call is not None:
            digest = self._digest_of(record.call)
        else:
            digest = None
        provenance = record.provenance
        surface_line = None
        evidence: list[dict[str, str]] = []  # the records this call produced, by content hash (bundle.py)
        if record.tool is not None and self._surface is not None:
            effect, status = effect_status(record.outcome)
            rule_id = None
            if provenance is not None and provenance.policy is not None:
                rule_id = provenance.policy if provenance.rule_index is None else f"{provenance.policy}#{provenance.rule_index}"
            surface_line, surface_hash = self._surface_line(record, arguments, effect, status, rule_id)
            if surface_hash is not None:
                evidence.append({"content_hash": surface_hash, "type": SURFACE_SCHEMA})
        if carrier_hash is not None:
            evidence.append({"content_hash": carrier_hash, "type": CARRIER_SCHEMA})
        # A read drawbridge knows keeps its target's digest (observed_confirmed, observed_read.py).
        observed = read_subject(record.tool, arguments) if record.tool is not None and arguments is not None else None
        return "tool_decision", self._trace_body_bytes(record, digest, evidence, observed), surface_line, carrier_line

    @staticmethod
    def _varying(
        record: CallRecord, digest: str | None, evidence: list[dict[str, str]]
    ) -> tuple[str | None, float | None, list[dict[str, str]], float, str | None]:
        """The trace body's fields that change from call to call, in the order of ``BODY_VARYING``."""
        decision_ms = round(record.decision_ms, 3) if record.decision_ms is not None else None
        return digest, decision_ms, evidence, round(record.latency_ms, 3), _request_id_text(record.request_id)

    @classmethod
    def _trace_body(
        cls, record: CallRecord, digest: str | None, evidence: list[dict[str, str]], observed: Any = None,
        replica: str | None = None,
    ) -> dict[str, Any]:
        """The trace entry's body (docs/trace-chain.md): the reference for ``_trace_body_bytes``."""
        provenance = record.provenance
        body: dict[str, Any] = {
            "agent": sanitize(record.agent),
            "tool": record.tool,
            "action": record.action.value if record.action is not None else None,
            "policy": sanitize(provenance.policy) if provenance and provenance.policy else None,
            "source_file": provenance.source_file if provenance else None,
            "rule_index": provenance.rule_index if provenance else None,
            "reason": sanitize(record.reason) if record.reason is not None else None,
            "outcome": record.outcome.value,
            "error": sanitize(record.error) if record.error is not None else None,
            "error_code": record.error_code,
            "protocol_version": record.protocol_version,
        }
        body.update(zip(BODY_VARYING, cls._varying(record, digest, evidence), strict=True))
        body.update({"replica": replica} if replica is not None else ())
        body.update({"policy_set_digest": provenance.policy_set} if provenance and provenance.policy_set else ())
        body.update({"approval": dict(record.approval)} if record.approval is not None else ())
        body.update({"observed_read": dict(observed)} if observed is not None else ())
        body.update({"result_guard": record.result_guard.trace_body()} if record.result_guard is not None else ())
        return body

    def _trace_body_bytes(
        self, record: CallRecord, digest: str | None, evidence: list[dict[str, str]], observed: Any = None
    ) -> Canonical:
        """``canonical_bytes(_trace_body(...))``, by a shorter route: the body's other fields repeat
        from call to call, so the JCS text around the four that change is rendered once per such
        combination (a bounded cache) and the four are filled in."""
        replica = self._trace.replica if self._trace is not None else None
        if record.approval is not None or observed is not None or record.result_guard is not None:  # rare: the general route
            return Canonical(canonical_bytes(self._trace_body(record, digest, evidence, observed, replica)))
        key = (record.agent, record.tool, record.action, record.provenance, record.reason, record.outcome,
               record.error, record.error_code, record.protocol_version)
        segments = self._body_segments.get(key)
        if segments is None:
            body = self._trace_body(record, digest, evidence, replica=replica)
            segments = body_segments(body)
            if segments is None:  # a field holds a mark's text: the general route, not cached
                return Canonical(canonical_bytes(body))
            if len(self._body_segments) >= SURFACE_CACHE_MAX:
                self._body_segments.clear()
            self._body_segments[key] = segments
        return body_join(segments, self._varying(record, digest, evidence))

    def _surface_line(
        self, record: CallRecord, arguments: Any, effect: str, status: str, rule_id: str | None
    ) -> tuple[bytes, str | None]:
        """The surface record's line. ``build_decision`` reads the arguments only through the
        classifier and the params only for ``_meta.traceparent``: for a tool the classifier does not
        know (its answer is then the constant ``UNKNOWN``, whatever the arguments) and a call without
        ``_meta``, the line is a function of (server, tool, effect, status, rule) alone, so it is
        built once per such key and reused (a bounded cache), with its content hash."""
        assert record.tool is not None
        server_id = self._route(record.tool)
        meta = record.call.meta if record.call is not None else None
        key = None
        if not meta and classify(record.tool, arguments) is UNKNOWN:
            key = (server_id, record.tool, effect, status, rule_id)
            cached = self._surface_cache.get(key)
            if cached is not None:
                return cached
        decision = build_decision(
            server_id=server_id,
            tool_name=record.tool,
            arguments=arguments,
            params={"_meta": dict(meta)} if meta else {},
            effect=effect,
            status=status,
            rule_id=rule_id,
        )
        surface = build_surface([decision])
        built = ndjson_line(surface), record_hash(SURFACE_SCHEMA, surface)
        if key is not None:
            if len(self._surface_cache) >= SURFACE_CACHE_MAX:
                self._surface_cache.clear()
            self._surface_cache[key] = built
        return built

    def _carrier_fields(self, record: CallRecord) -> dict[str, Any]:
        """What ``build_carrier`` is given for this call (the next ``order`` is taken)."""
        assert self._truth_key is not None and record.call is not None
        order = self._order
        self._order += 1
        _contract, dpd, prepared = self._declared_for(record.agent)
        identity = "present" if record.tool_listed else "absent"
        # The gateway does not yet observe class, scope or redaction: those axes stay "incomplete",
        # never a guessed match. Approval is observed when a person, a grant or approval memory let
        # this call through; otherwise it is left unobserved too.
        evidence = _APPROVED if approval_obtained(record) else _UNOBSERVED
        verdict = prepared_decision_verdict(
            prepared, record.call.tool, record.call.arguments, identity, evidence
        )
        return {
            "tool_name": record.call.tool,
            "args": record.call.arguments,
            "order": order,
            "declared_policy_digest": dpd,
            "key": self._truth_key.key,
            "key_id": self._truth_key.key_id,
            "source_class": "authoritative_boundary",
            "call_id": truth_call_id(record),
            "result_status": "ok",
            "identity_state": identity,
            "decision_verdict": verdict,
        }

    def _carrier(self, record: CallRecord) -> dict[str, Any]:
        """The call's truth carrier (the reference for ``_carrier_line``)."""
        return build_carrier(**self._carrier_fields(record))

    def _carrier_line(self, record: CallRecord) -> tuple[bytes, str, str | None]:
        """``ndjson_line(_carrier(record))``, the carrier's ``args_digest`` and its content hash, by a
        shorter route: per tool, verdict and contract a carrier differs from the last only in its
        digests, its order and its call id, so its line and its JCS text around those are rendered once
        (from a carrier minted by ``build_carrier``, which checks every field) and they are filled in."""
        fields = self._carrier_fields(record)
        key = (fields["tool_name"], fields["identity_state"], fields["decision_verdict"],
               fields["declared_policy_digest"], fields["key_id"])
        cached = self._carrier_segments.get(key)
        if cached is None:
            carrier = build_carrier(**fields)
            segments, jcs_segments = carrier_segments(carrier), carrier_jcs_segments(carrier)
            if segments is not None and jcs_segments is not None:
                if len(self._carrier_segments) >= SURFACE_CACHE_MAX:
                    self._carrier_segments.clear()
                self._carrier_segments[key] = (segments, jcs_segments)
            return ndjson_line(carrier), carrier["args_digest"], record_hash(CARRIER_SCHEMA, carrier)
        digest = self._digest_of(record.call)  # the truth key is the digest key
        call_id = fields["call_id"]
        if digest is None or not isinstance(call_id, str):
            carrier = build_carrier(**fields)  # raises CarrierError, naming the field at fault
            return ndjson_line(carrier), carrier["args_digest"], record_hash(CARRIER_SCHEMA, carrier)
        order = fields["order"]
        try:
            observed = observed_input_digest(fields["tool_name"], digest, order)
            texts = carrier_texts(digest, order, call_id, observed)
        except UnicodeEncodeError:  # the line escapes the call id: the general route
            carrier = build_carrier(**fields)
            return ndjson_line(carrier), digest, record_hash(CARRIER_SCHEMA, carrier)
        segments, jcs_segments = cached
        jcs = carrier_jcs_join(jcs_segments, texts)
        return carrier_join(segments, texts), digest, content_hash_of_json(CARRIER_SCHEMA, jcs)

    # ---------------------------------------------------------------- writing

    def _write(self, at: str, built: Sequence[_Lines]) -> list[int]:
        """Write the records' lines, one ``os.write`` per file for them all; return the files
        (0 trace, 1 surface, 2 truth) now due an fsync ("always", or "batch" at ``batch_limit``
        unsynced lines)."""
        self._raise_if_broken()
        due: list[int] = []
        if self._trace is not None:
            self._trace.append_many([(kind, at, body) for kind, body, _surface, _carrier in built])
            self._count(0, due, len(built))
        if self._surface is not None:
            surfaces = [surface for _kind, _body, surface, _carrier in built if surface is not None]
            if surfaces:
                self._surface.append_lines(surfaces, "surface records")
                self._count(1, due, len(surfaces))
        if self._truth is not None:
            carriers = [carrier for _kind, _body, _surface, carrier in built if carrier is not None]
            if carriers:
                self._truth.append_lines(carriers, "truth carriers")
                self._count(2, due, len(carriers))
        return due

    def _lines(self, event: RelayEvent) -> _Lines:
        if isinstance(event, RelayIncident):
            body = {"kind": event.kind, "direction": event.direction, "detail": sanitize(event.detail),
                    "code": event.code, **({} if event.agent is None else {"agent": sanitize(event.agent)})}
            return ("relay_incident", body, None, None)
        return self._call_lines(event)

    async def __call__(self, event: RelayEvent) -> None:
        rest = self._record_inline([event])
        if rest is not None:
            await rest

    def _record_inline(self, events: Sequence[RelayEvent]) -> Awaitable[None] | None:
        at = self._clock()
        due = self._write(at, [self._lines(event) for event in events])
        return self._sync_off_loop(due) if due else None

    @property
    def record_now(self) -> Callable[[Sequence[RelayEvent]], Awaitable[None] | None]:
        """The synchronous form of awaiting the recorder, for several events at once: their lines,
        one write per file, written (to the kernel) before it returns. It returns None when the
        records are complete, or, when they are due an fsync ("always", or ``batch_limit`` unsynced
        lines under "batch"), an awaitable that completes (or raises) with that fsync, done in worker threads
        so the event loop serves other calls meanwhile; they are complete only then. Records
        written together share that fsync (a group commit)."""
        return self._record_inline

    async def record_event(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A trace entry that is not a call (policy edit, pin accept, approval, grant)."""
        if self._trace is None:
            return None
        at = self._clock()
        self._raise_if_broken()
        entry = self._trace.append(kind, at, body)
        due: list[int] = []
        self._count(0, due)
        if due:
            await self._sync_off_loop(due)
        return entry

    @property
    def trace(self) -> TraceLog | None:  # what signed checkpoints cover; None without an evidence directory
        return self._trace

    def close(self) -> None:
        """Close the files (each fsyncs what it holds unsynced, unless the setting is "never")."""
        self._stop_syncing()
        for sink in (self._trace, self._surface, self._truth):
            if sink is not None:
                sink.close()
        self._close_sync_fds()


__all__ = ["EvidenceRecorder", "TruthKey", "effect_status", "ephemeral_key", "truth_call_id", "utc_now"]
