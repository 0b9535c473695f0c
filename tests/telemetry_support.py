"""A real OTLP/HTTP receiver for the telemetry tests: it keeps every request body the exporter sends
and decodes it with opentelemetry-proto (spans, metrics, log records)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conftest import scaled
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

WAIT = scaled(60.0)
KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT"}
REQUESTS = {"/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
            "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
            "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse)}


FLOOD_DECLARED = 3 * 1024**3
"""The body length a flooding receiver declares (3 GiB); it sends at most ``flood`` bytes of it."""


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: keeps every request body and decodes it; ``hang`` makes it
    never answer (a collector that stalls), ``status`` answers every export so (500: refused), and
    ``flood`` answers with a body declared 3 GiB long, of which it writes up to ``flood`` bytes for as
    long as the exporter reads (``flooded``: how many it could write)."""

    def __init__(self, hang: threading.Event | None = None, *, status: int = 200, flood: int = 0) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.arrived = threading.Condition()
        self.flooded = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.arrived:
                    receiver.bodies.append((self.path, body))
                    receiver.arrived.notify_all()
                if hang is not None:
                    hang.wait(WAIT)
                    return
                if flood:
                    self._flood()
                    return
                kind = REQUESTS.get(self.path)
                payload = kind[1]().SerializeToString() if kind else b""
                self.send_response(status if kind else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _flood(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(FLOOD_DECLARED))
                self.end_headers()
                chunk = bytes(1024 * 1024)
                try:
                    while receiver.flooded < flood:
                        self.wfile.write(chunk)
                        receiver.flooded += len(chunk)
                except OSError:
                    pass  # the exporter closed the connection: the rest goes unread
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def decoded(self, path: str) -> list[Any]:
        return [REQUESTS[path][0].FromString(body) for p, body in list(self.bodies) if p == path]

    def spans(self) -> list[Any]:
        return [span for request in self.decoded("/v1/traces") for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(item: Any) -> dict[str, Any]:
    out = {}
    for kv in item.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def metric_points(receiver: Receiver) -> list[tuple[str, dict[str, Any]]]:
    """Every data point received: its metric's name and its attributes."""
    return [(m.name, attributes(point)) for r in receiver.decoded("/v1/metrics") for rm in r.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics for point in m.histogram.data_points]
