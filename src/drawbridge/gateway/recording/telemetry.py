"""Live telemetry: an OpenTelemetry span per tools/call, the MCP duration metrics, and every signed
checkpoint as a log record, exported over OTLP (HTTP/protobuf or gRPC) by ``opentelemetry-sdk``.

Invariant: telemetry never delays, fails or changes a call. The call's path only appends the batch of
records it has just written to a queue (``observe``); a thread of this process turns them into
summaries without any argument or result (``summary``) and writes them, many per write, to the
telemetry worker, a process of its own (``telemetry_worker``) where the SDK makes the spans and
metric points and its batch processors export them. A collector that is down or slow holds up the
worker, never a call; so does the SDK's own work, which runs on another core than the gateway's
(on two cores, making spans in a thread of the gateway would take the calls' interpreter lock). When
the queue is full, or the worker is gone, summaries are dropped and counted, never waited for. The
worker's stderr lines (the SDK's warnings: a collector that is down) are read by a thread of their
own and logged through ``drawbridge.telemetry``, so that they follow the gateway's log format.

Shutdown is bounded too: the worker's last export gets ``last_export_seconds`` (wrap's default keeps
wrap within the 2 s an MCP client gives it), the worker is killed if it overstays that by
``STOP_MARGIN_SECONDS``, and it never outlives the gateway (``telemetry_worker``). The worker's
environment holds none of the gateway's credentials (``withheld_env``): the collector's header values
travel in the settings frame.

No agent-chosen name grows a label: a tool name the served catalogue does not list (unknown, or a
request refused before it was resolved) is ``OTHER_TOOL`` in the metric attributes, the span names
and the span attributes alike (the OTel placeholder for a value outside a known set). The
conventions require ``gen_ai.tool.name`` on a tool span, not the agent's spelling of a name that
does not exist; the trace line the span points to (``drawbridge.trace.index``) keeps that, sanitized.
Nor does any string make a span long: the worker cuts every attribute and status text to
``telemetry_worker.MAX_ATTRIBUTE_CHARS``, so that no one call can make a collector refuse the batch
its span travels in (and with it the other calls' spans).

Spans (semantic-conventions-genai, MCP; auditor-evidence.md 6.7):

- SERVER ``tools/call {tool}``: ``mcp.method.name``, ``gen_ai.tool.name``, ``gen_ai.operation.name``
  ``execute_tool``, ``jsonrpc.request.id`` (string), ``mcp.protocol.version``, ``network.transport``
  (``pipe`` for stdio, ``tcp`` for HTTP), ``error.type`` (the JSON-RPC code, or ``tool_error`` for
  every ``CallToolResult`` with ``isError: true``: the tool's own, and the gateway's refusals --
  policy, schema, approval denied or unavailable, an approval still pending) and status ERROR, and
  ``rpc.response.status_code`` for a JSON-RPC error, ``drawbridge.decision.effect`` / ``.policy`` /
  ``.rule_index``, ``drawbridge.trace.origin`` and ``drawbridge.trace.index``. Its parent is the
  agent's, from ``params._meta.traceparent`` / ``tracestate`` (always recorded and exported, whatever
  the parent's sampled flag); an approval is an event on it
  (``drawbridge.approval``: settled, channel, strength). ``mcp.session.id`` only where a session id
  exists: a 2025-11-25 session of serve over HTTP (its ``Mcp-Session-Id``).
- CLIENT ``tools/call {tool}``, the forward to the upstream, child of the SERVER span; absent when
  nothing was forwarded. The upstream's own ``_meta`` is forwarded unchanged (DESIGN 2), so the
  upstream parents to the agent's span, not to this one.
- Histograms ``mcp.server.operation.duration`` and ``mcp.client.operation.duration`` (seconds, the
  conventions' buckets); log records ``drawbridge.trace.checkpoint`` (the signed note).
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from drawbridge.config_evidence import telemetry_header_problem
from drawbridge.gateway.pipeline.outcomes import Outcome
from drawbridge.gateway.pipeline.records import CallRecord, RelayEvent
from drawbridge.gateway.recording.recorder import _request_id_text

logger = logging.getLogger("drawbridge.telemetry")

PROTOCOLS: Final = ("http/protobuf", "grpc")
OTHER_TOOL: Final = "_OTHER"
"""The tool name telemetry shows for a name the served catalogue does not list (module docstring)."""
LAST_EXPORT_SECONDS: Final = 0.75
"""wrap's bound on the worker's last export: after the server's 1 s to exit, wrap is done within 2 s."""
SERVE_LAST_EXPORT_SECONDS: Final = 3.0
"""serve's: a service manager gives a service longer than an MCP client gives a stdio server."""
STOP_MARGIN_SECONDS: Final = 2.0
"""How long past its last export's bound the worker is waited for before it is killed: the worker
ends its own export on time (a slow collector costs no more than the bound); this margin is for a
worker the CPU starves (it runs niced), which would otherwise lose a healthy collector's spans."""
QUEUE_MAX: Final = 4096
"""Batches waiting for the sender; beyond it they are dropped (and counted), never waited for."""
SEND_EVERY_SECONDS: Final = 0.05
SEND_AT: Final = 64
INSTALL_HINT: Final = "pip install 'drawbridge[telemetry]'"
_MODULES: Final = {
    "http/protobuf": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
    "grpc": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
}


class TelemetryUnavailable(Exception):
    """Telemetry is configured but cannot run (its packages are not installed, a header variable is
    missing, the worker cannot start): a startup error."""


@dataclass(frozen=True)
class TelemetrySettings:
    endpoint: str
    protocol: str = "http/protobuf"
    headers_env: Mapping[str, str] = field(default_factory=dict)
    """Header name -> the environment variable that holds its value (read by the worker)."""
    service_name: str = "drawbridge"
    timeout_seconds: float = 5.0
    last_export_seconds: float = LAST_EXPORT_SECONDS
    """How long the worker's last export may take at shutdown; what is not sent by then is dropped."""
    withheld_env: frozenset[str] = frozenset()
    """The gateway's credential variables: not in the worker's environment (nor is any ``DRAWBRIDGE_*``)."""


def answered_is_error(record: CallRecord) -> bool:
    """The call was answered with a ``CallToolResult`` holding ``isError: true``: the tool's own, or
    the gateway's refusal (``verdicts.refusal_result``, ``questions.pending``); a 2026-07-28 approval
    still open is answered with an ``InputRequiredResult`` instead, which is no error."""
    if record.outcome in (Outcome.TOOL_ERROR, Outcome.REFUSED, Outcome.APPROVAL_UNAVAILABLE):
        return True
    if record.outcome is Outcome.APPROVAL_PENDING:
        return record.approval is None or record.approval.get("settled") != "input_required"
    return False


def summary(record: CallRecord, index: int | None, end: int) -> tuple[Any, ...]:
    """What the worker gets of a call (``telemetry_worker``'s field order): no argument, no result,
    and no tool name the served catalogue does not list (``OTHER_TOOL``)."""
    meta = record.call.meta if record.call is not None else None
    parent = meta.get("traceparent") if meta else None
    state = meta.get("tracestate") if meta else None
    provenance = record.provenance
    approval = record.approval
    shown = {key: str(approval[key]) for key in ("settled", "channel", "strength")
             if approval is not None and approval.get(key) is not None}
    request_id = record.request_id
    shown_id = str(request_id) if type(request_id) is int else _request_id_text(request_id)
    return (
        record.tool if record.tool_listed and record.tool else OTHER_TOOL, shown_id, record.protocol_version,
        record.action.value if record.action is not None else None,
        provenance.policy if provenance is not None else None,
        provenance.rule_index if provenance is not None else None,
        record.error_code, answered_is_error(record), record.error, record.latency_ms, record.decision_ms,
        record.forwarded, shown or None, parent if isinstance(parent, str) else None,
        state if isinstance(state, str) else None, index, end, record.session_id,
    )


class Telemetry:
    """The gateway's side of telemetry: the queue, the sender thread and the worker (module docstring)."""

    def __init__(
        self, settings: TelemetrySettings, environ: Mapping[str, str], *, network_transport: str,
        origin: str | None = None,
    ) -> None:
        try:
            for module in _MODULES[settings.protocol]:
                importlib.import_module(module)
        except ImportError:
            raise TelemetryUnavailable(
                f"telemetry is configured but opentelemetry-sdk and its OTLP {settings.protocol} exporter are not "
                f"installed ({INSTALL_HINT})"
            ) from None
        for name, variable in settings.headers_env.items():
            if (problem := telemetry_header_problem(name, variable, environ)) is not None:
                raise TelemetryUnavailable(problem)
        headers = {name: environ[variable] for name, variable in settings.headers_env.items()}
        withheld = settings.withheld_env | frozenset(settings.headers_env.values())
        env = {name: value for name, value in environ.items()
               if name not in withheld and not name.startswith("DRAWBRIDGE_")}
        from drawbridge import __version__

        try:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "drawbridge.gateway.recording.telemetry_worker"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                close_fds=True,
            )
        except OSError as exc:
            raise TelemetryUnavailable(f"the telemetry worker cannot start: {exc.strerror or exc}") from None
        self.origin = origin
        self.dropped = 0
        self._pending: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._broken = False
        self._last_export = settings.last_export_seconds
        # The worker dies with the thread that started it (PR_SET_PDEATHSIG): only the main thread's
        # end is the gateway's.
        main = threading.current_thread() is threading.main_thread()
        self._send(("settings", {
            "endpoint": settings.endpoint, "protocol": settings.protocol, "headers": headers,
            "service_name": settings.service_name, "timeout_seconds": settings.timeout_seconds,
            "network_transport": network_transport, "origin": origin, "version": __version__,
            "last_export_seconds": settings.last_export_seconds, "die_with": os.getpid() if main else None,
        }))
        self._thread = threading.Thread(target=self._run, name="drawbridge-telemetry", daemon=True)
        self._thread.start()
        self._stderr = threading.Thread(target=self._relay_stderr, name="drawbridge-telemetry-log", daemon=True)
        self._stderr.start()

    # ------------------------------------------------------------------------------ the call's side

    def observe(self, events: Sequence[RelayEvent], last_index: int | None) -> None:
        """Queue a batch just recorded (``last_index``: the trace index of its last entry, one entry per
        event). An append; never waits."""
        pending = self._pending
        if len(pending) >= QUEUE_MAX or self._broken:
            self.dropped += len(events)
            return
        pending.append(("calls", time.time_ns(), events, last_index))
        if len(pending) >= SEND_AT:
            self._wake.set()

    def checkpoint(self, size: int, note: str) -> None:
        """A signed checkpoint, sent off the machine as a log record (the note is public material)."""
        self._pending.append(("checkpoint", size, note))
        self._wake.set()

    # ------------------------------------------------------------------------------ the sender thread

    def _send(self, frame: tuple[Any, ...]) -> None:
        stdin = self._worker.stdin
        assert stdin is not None
        data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            stdin.write(len(data).to_bytes(4, "big") + data)
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            if not self._broken:
                cause = _ended(self._worker)
                if self._stopping:
                    logger.warning("the telemetry worker %s before the last export was handed to it", cause)
                else:
                    logger.error("the telemetry worker %s; telemetry is dropped from now on", cause)
            self._broken = True

    def _relay_stderr(self) -> None:
        """The worker's lines (``LEVEL logger: message``), logged at their level in the gateway's format."""
        stream = self._worker.stderr
        if stream is None:
            return
        for raw in stream:
            line = " ".join(raw.decode("utf-8", "replace").split())[:1000]
            if not line:
                continue
            word, _space, rest = line.partition(" ")
            level = logging.getLevelName(word)
            if isinstance(level, int):
                logger.log(level, "telemetry worker: %s", rest)
            else:
                logger.warning("telemetry worker: %s", line)

    def _drain(self) -> None:
        calls: list[tuple[Any, ...]] = []
        pending = self._pending
        while pending:
            item = pending.popleft()
            if item[0] == "checkpoint":
                self._send(item)
                continue
            _kind, end, events, last_index = item
            for position, event in enumerate(events):
                if isinstance(event, CallRecord):
                    index = None if last_index is None else last_index - (len(events) - 1 - position)
                    calls.append(summary(event, index, end))
        if calls and not self._broken:
            self._send(("calls", calls))

    def _run(self) -> None:
        while True:
            self._wake.wait(SEND_EVERY_SECONDS)
            self._wake.clear()
            try:
                self._drain()
            except Exception as exc:  # noqa: BLE001 -- telemetry never stops the gateway
                logger.error("telemetry could not send a batch (%s)", type(exc).__name__)
            if self._stopping and not self._pending:
                return

    def shutdown(self) -> None:
        """Send what is queued, let the worker make its last export within ``last_export_seconds``
        (it says what it dropped), and stop it: kill it if it overstays by ``STOP_MARGIN_SECONDS``."""
        self._stopping = True
        self._wake.set()
        self._thread.join(STOP_MARGIN_SECONDS)
        if self._thread.is_alive():  # the pipe to the worker is full: what is still queued is dropped
            self._broken = True
        if self.dropped:
            logger.warning("telemetry dropped %d call(s) its queue could not hold", self.dropped)
        if self._worker.stdin is not None:
            try:
                self._worker.stdin.close()
            except OSError:
                pass
        bound = self._last_export + STOP_MARGIN_SECONDS
        try:
            self._worker.wait(bound)
        except subprocess.TimeoutExpired:
            logger.warning("the telemetry worker did not end within %g s of the last export; stopped, its export dropped",
                           bound)
            self._worker.kill()
            self._worker.wait()
        self._stderr.join(STOP_MARGIN_SECONDS)


def _ended(worker: subprocess.Popen[bytes]) -> str:
    """How the worker ended, for the line that says it is gone."""
    code = worker.poll()
    if code is None:
        return "stopped reading its input"
    if code < 0:
        try:
            return f"was ended by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"exited with status {code}"


__all__ = [
    "LAST_EXPORT_SECONDS", "OTHER_TOOL", "SERVE_LAST_EXPORT_SECONDS", "PROTOCOLS", "Telemetry", "TelemetrySettings", "TelemetryUnavailable",
    "answered_is_error", "summary",
]
