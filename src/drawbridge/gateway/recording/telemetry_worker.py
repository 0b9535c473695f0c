"""The telemetry worker: a process of its own that turns the gateway's call summaries into
OpenTelemetry spans and metric points, and its checkpoints into log records, and exports them over
OTLP with ``opentelemetry-sdk`` and its exporters.

Invariant: the worker sees only what ``telemetry.summary`` puts in a summary (tool, request id as
text, protocol version, decision, policy, rule, outcome, error code and text, timings, approval
channel, the agent's ``traceparent`` / ``tracestate``, trace index, HTTP session id): never an argument, never a
result. It writes nothing to the gateway's stdin or stdout (it has neither); its own and the SDK's
warnings (a collector that is down) go to its stderr, one line each (``LEVEL logger: message``, an
exception by its type only), which the gateway reads and logs in its own log format. It ends when
its input ends, after one last export of spans, metrics and log records at once, bounded by
``last_export_seconds`` (what the collector has not taken by then, refused or not yet sent, is
dropped, and said in one line with the number of spans lost), and only then: SIGINT and SIGTERM sent to the whole process group
(Ctrl-C, a service manager) are the gateway's to act on, which then closes the input. It never
outlives the gateway: a gateway that dies (SIGKILL) takes it along (``PR_SET_PDEATHSIG`` where Linux
has it, and its input's end). It runs at a lower priority than the gateway (``NICENESS``).

Spans are sampled always, whatever the agent's ``traceparent`` says: its flags cannot switch off the
gateway's SERVER span for a call (the agent's span stays the parent). The header values (the
collector's credentials) come in the settings frame, not in the worker's environment. What it reads
of a collector's answers is bounded (``telemetry_http``).

Frames on stdin: a 4-byte big-endian length, then a pickled tuple: ``("calls", [summary, ...])``
or ``("checkpoint", tree_size, note)``. The first frame is ``("settings", {...})``. Spans and
attributes are described in ``telemetry``'s module docstring.

Run as ``python -m drawbridge.gateway.recording.telemetry_worker`` (the gateway starts it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Final

BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
QUEUE_MAX: Final = 8192
MAX_ATTRIBUTE_CHARS: Final = 256
"""The longest string a span or event attribute, or a span's status description, carries: a request
id (128 characters at most), a version, a tool or policy name fit; anything longer that reached a
summary (an upstream's error text, a version an upstream answered) is cut, so that no one span can
make the collector refuse the batch it travels in, and the other calls' spans with it."""

# summary fields, in order (``telemetry.summary``)
TOOL, REQUEST_ID, PROTOCOL, EFFECT, POLICY, RULE, ERROR_CODE, TOOL_ERROR, ERROR, LATENCY, DECISION, \
    FORWARDED, APPROVAL, TRACEPARENT, TRACESTATE, INDEX, END, SESSION = range(18)


def _exporters(settings: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    headers = dict(settings["headers"]) or None
    timeout = settings["timeout_seconds"]
    endpoint = settings["endpoint"]
    if settings["protocol"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        from drawbridge.gateway.recording.telemetry_http import GRPC_OPTIONS

        options = {"endpoint": endpoint, "insecure": endpoint.startswith("http://"), "headers": headers, "timeout": timeout,
                   "channel_options": GRPC_OPTIONS}
        return OTLPSpanExporter(**options), OTLPMetricExporter(**options), OTLPLogExporter(**options)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    from drawbridge.gateway.recording.telemetry_http import BoundedSession

    base = endpoint.rstrip("/")
    # One session each (the exporters close theirs at shutdown), each reading bounded answers.
    return (HttpSpans(endpoint=f"{base}/v1/traces", headers=headers, timeout=timeout, session=BoundedSession()),
            HttpMetrics(endpoint=f"{base}/v1/metrics", headers=headers, timeout=timeout, session=BoundedSession()),
            HttpLogs(endpoint=f"{base}/v1/logs", headers=headers, timeout=timeout, session=BoundedSession()))


class CountingSpans:
    """The span exporter, counting the spans the collector took: the last export says how many of
    the spans made were lost."""

    def __init__(self, exporter: Any) -> None:
        self._exporter = exporter
        self.exported = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self._exporter.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._exporter.force_flush(timeout_millis))


class Exporter:
    """The SDK's providers, and the spans and points of each summary."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        spans, metrics, logs = _exporters(settings)
        self.spans = CountingSpans(spans)
        self.made = 0
        version = settings["version"]
        resource = Resource.create({"service.name": settings["service_name"], "service.version": version})
        # ALWAYS_ON, not the default parent-based sampler: an agent's traceparent with flags 00 would
        # otherwise switch the gateway's spans off (module docstring).
        self.tracer_provider = TracerProvider(sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False,
                                              span_limits=SpanLimits(max_attribute_length=MAX_ATTRIBUTE_CHARS))
        self.tracer_provider.add_span_processor(BatchSpanProcessor(self.spans, max_queue_size=QUEUE_MAX))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(metrics)],
                                            shutdown_on_exit=False)
        self.logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(logs))
        self.tracer = self.tracer_provider.get_tracer("drawbridge", version)
        meter = self.meter_provider.get_meter("drawbridge", version)
        self.server_duration = meter.create_histogram(
            "mcp.server.operation.duration", unit="s", description="tools/call as the gateway served it",
            explicit_bucket_boundaries_advisory=BUCKETS)
        self.client_duration = meter.create_histogram(
            "mcp.client.operation.duration", unit="s", description="tools/call as the upstream answered it",
            explicit_bucket_boundaries_advisory=BUCKETS)
        self.logger = self.logger_provider.get_logger("drawbridge.checkpoints", version)
        self.propagator = TraceContextTextMapPropagator()
        self.transport = settings["network_transport"]
        self.origin = settings["origin"]

    def checkpoint(self, size: int, note: str) -> None:
        self.logger.emit(body=note, event_name="drawbridge.trace.checkpoint", attributes={
            "drawbridge.trace.origin": self.origin or "", "drawbridge.trace.tree_size": size})

    def call(self, s: tuple[Any, ...]) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        end = s[END]
        start = end - int(s[LATENCY] * 1_000_000)
        attributes: dict[str, Any] = {"mcp.method.name": "tools/call", "gen_ai.tool.name": s[TOOL],
                                      "gen_ai.operation.name": "execute_tool", "network.transport": self.transport}
        for key, field in (("jsonrpc.request.id", REQUEST_ID), ("mcp.protocol.version", PROTOCOL),
                           ("drawbridge.decision.effect", EFFECT), ("drawbridge.decision.policy", POLICY),
                           ("drawbridge.decision.rule_index", RULE), ("drawbridge.trace.index", INDEX),
                           ("mcp.session.id", SESSION)):
            if s[field] is not None:
                attributes[key] = s[field]
        if self.origin is not None:
            attributes["drawbridge.trace.origin"] = self.origin
        error_type = str(s[ERROR_CODE]) if s[ERROR_CODE] is not None else ("tool_error" if s[TOOL_ERROR] else None)
        if s[ERROR_CODE] is not None:
            attributes["rpc.response.status_code"] = str(s[ERROR_CODE])
        if error_type is not None:
            attributes["error.type"] = error_type
        status = Status(StatusCode.ERROR, (s[ERROR] or error_type)[:MAX_ATTRIBUTE_CHARS]) if error_type else None
        carrier = {key: value for key, value in (("traceparent", s[TRACEPARENT]), ("tracestate", s[TRACESTATE])) if value}
        parent = self.propagator.extract(carrier) if carrier else None
        name = f"tools/call {s[TOOL]}" if s[TOOL] else "tools/call"
        server = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes,
                                        start_time=start)
        decided = start + int((s[DECISION] or 0.0) * 1_000_000)
        if s[APPROVAL]:
            server.add_event("drawbridge.approval", timestamp=decided, attributes=dict(s[APPROVAL]))
        metric = {"mcp.method.name": "tools/call", "gen_ai.tool.name": s[TOOL]}
        if error_type is not None:
            metric["error.type"] = error_type
        if s[FORWARDED]:
            client_attributes = {key: attributes[key] for key in (
                "mcp.method.name", "gen_ai.tool.name", "gen_ai.operation.name", "jsonrpc.request.id",
                "mcp.protocol.version", "error.type", "rpc.response.status_code") if key in attributes}
            client = self.tracer.start_span(name, context=set_span_in_context(server), kind=SpanKind.CLIENT,
                                            attributes=client_attributes, start_time=decided)
            if status is not None:
                client.set_status(status)
            client.end(end_time=end)
            self.client_duration.record((end - decided) / 1e9, metric)
        if status is not None:
            server.set_status(status)
        server.end(end_time=end)
        self.made += 2 if s[FORWARDED] else 1
        self.server_duration.record(s[LATENCY] / 1000.0, metric)

    def shutdown(self, seconds: float) -> None:
        """The last export, of the three signals at once, for at most ``seconds``; what the collector
        has not taken by then is dropped, and said once."""
        def stop(provider: Any) -> None:
            try:
                provider.shutdown()
            except Exception as exc:  # noqa: BLE001 -- a collector that is down does not stop the shutdown
                logging.getLogger("drawbridge.telemetry").warning("telemetry export at shutdown failed (%s)", type(exc).__name__)

        threads = [threading.Thread(target=stop, args=(provider,), daemon=True)
                   for provider in (self.tracer_provider, self.meter_provider, self.logger_provider)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + seconds
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        lost = max(self.made - self.spans.exported, 0)  # refused, unsent, or over the processor's queue
        log = logging.getLogger("drawbridge.telemetry")
        if any(thread.is_alive() for thread in threads):
            log.warning("the collector did not take the last export within %g s: %d span(s) dropped, with the last "
                        "metrics and checkpoint records not yet sent", seconds, lost)
        elif lost:
            log.warning("the collector did not take %d of the %d span(s) made (refused, or not reached): dropped",
                        lost, self.made)


def read_frame(stream: BinaryIO) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    data = stream.read(int.from_bytes(header, "big"))
    return pickle.loads(data)


class OneLine(logging.Formatter):
    """``LEVEL logger: message`` on one line; an exception by its type, never its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            message = f"{message} ({record.exc_info[0].__name__})"
        return f"{record.levelname} {record.name}: {' '.join(message.split())}"


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


NICENESS: Final = 10
"""The worker yields the CPU to the gateway: on a busy host telemetry falls behind (and drops what its
queues cannot hold), the calls do not."""
PR_SET_PDEATHSIG: Final = 1


def _die_with(parent: int) -> None:
    """SIGKILL this worker when the gateway's thread that started it ends (Linux); a gateway already
    gone (reparented before the call) ends it at once."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(0)


def main(stream: BinaryIO) -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _log_to_stderr()
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    first = read_frame(stream)
    if not isinstance(first, tuple) or first[0] != "settings":
        return 2
    settings = first[1]
    if settings.get("die_with") is not None:
        _die_with(settings["die_with"])
    exporter = Exporter(settings)
    failures = 0
    while (frame := read_frame(stream)) is not None:
        try:
            if frame[0] == "calls":
                for summary in frame[1]:
                    exporter.call(summary)
            elif frame[0] == "checkpoint":
                exporter.checkpoint(frame[1], frame[2])
        except Exception as exc:  # noqa: BLE001 -- one bad summary never ends the telemetry
            failures += 1
            if failures <= 3:
                logging.getLogger("drawbridge.telemetry").warning("a span could not be made (%s)", type(exc).__name__)
    if settings.get("die_with") is not None and os.getppid() != settings["die_with"]:
        return 0  # the gateway is gone: nobody waits for a last export
    exporter.shutdown(settings["last_export_seconds"])
    return 0


if __name__ == "__main__":
    code = main(sys.stdin.buffer)
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: a last export still under way (dropped) must not hold the exit
