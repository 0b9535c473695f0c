"""The telemetry worker: a process of its own that turns the gateway's call summaries into
OpenTelemetry spans and metric points, and its checkpoints into log records, and exports them over
OTLP with ``opentelemetry-sdk`` and its exporters.

Invariant: the worker sees only what ``telemetry.summary`` puts in a summary (tool, request id as
text, protocol version, decision, policy, rule, outcome, error code and text, timings, approval
channel, the agent's ``traceparent`` / ``tracestate``, trace index, HTTP session id): never an argument, never a
result. It writes nothing to the gateway's stdin or stdout (it has neither); its own and the SDK's
warnings (a collector that is down) go to its stderr, one line each (``LEVEL logger: message``, an
exception by its type only), which the gateway reads and logs in its own log format. It ends when
its input ends, after one last export bounded by the exporters' timeouts, and only then: SIGINT and
SIGTERM sent to the whole process group (Ctrl-C, a service manager) are the gateway's to act on,
which then closes the input. It runs at a lower priority than the gateway (``NICENESS``).

Frames on stdin: a 4-byte big-endian length, then a pickled tuple: ``("calls", [summary, ...])``
or ``("checkpoint", tree_size, note)``. The first frame is ``("settings", {...})``. Spans and
attributes are described in ``telemetry``'s module docstring.

Run as ``python -m drawbridge.gateway.recording.telemetry_worker`` (the gateway starts it).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO, Final

BUCKETS: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
QUEUE_MAX: Final = 8192

# summary fields, in order (``telemetry.summary``)
TOOL, REQUEST_ID, PROTOCOL, EFFECT, POLICY, RULE, ERROR_CODE, TOOL_ERROR, ERROR, LATENCY, DECISION, \
    FORWARDED, APPROVAL, TRACEPARENT, TRACESTATE, INDEX, END, SESSION = range(18)


def _exporters(settings: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    headers = None
    if settings["headers_env"]:
        headers = {name: os.environ.get(variable, "") for name, variable in settings["headers_env"].items()}
    timeout = settings["timeout_seconds"]
    endpoint = settings["endpoint"]
    if settings["protocol"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        options = {"endpoint": endpoint, "insecure": endpoint.startswith("http://"), "headers": headers, "timeout": timeout}
        return OTLPSpanExporter(**options), OTLPMetricExporter(**options), OTLPLogExporter(**options)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    base = endpoint.rstrip("/")
    return (HttpSpans(endpoint=f"{base}/v1/traces", headers=headers, timeout=timeout),
            HttpMetrics(endpoint=f"{base}/v1/metrics", headers=headers, timeout=timeout),
            HttpLogs(endpoint=f"{base}/v1/logs", headers=headers, timeout=timeout))


class Exporter:
    """The SDK's providers, and the spans and points of each summary."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        spans, metrics, logs = _exporters(settings)
        version = settings["version"]
        resource = Resource.create({"service.name": settings["service_name"], "service.version": version})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(spans, max_queue_size=QUEUE_MAX))
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(metrics)])
        self.logger_provider = LoggerProvider(resource=resource)
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
            if error_type is not None:
                client.set_status(Status(StatusCode.ERROR, s[ERROR] or error_type))
            client.end(end_time=end)
            self.client_duration.record((end - decided) / 1e9, metric)
        if error_type is not None:
            server.set_status(Status(StatusCode.ERROR, s[ERROR] or error_type))
        server.end(end_time=end)
        self.server_duration.record(s[LATENCY] / 1000.0, metric)

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider, self.logger_provider):
            try:
                provider.shutdown()
            except Exception as exc:  # noqa: BLE001 -- a collector that is down does not stop the shutdown
                logging.getLogger("drawbridge.telemetry").warning("telemetry export at shutdown failed (%s)", type(exc).__name__)


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
    exporter = Exporter(first[1])
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
    exporter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.stdin.buffer))
