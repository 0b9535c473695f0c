"""The gateway's Prometheus metrics: what ``/metrics`` on the control plane shows.

Invariant: a metric carries names the operator chose or the gateway defines -- action, outcome,
upstream name -- never an agent-supplied value (no tool name, no agent id: those would let an agent
grow the label space without bound) and never an argument. Observing a call costs a dictionary
lookup, a counter increment and two histogram observations: the label children are bound once per
(action, outcome) pair, of which there are a fixed few.

Theory of operation. ``GatewayMetrics`` owns a registry of its own (two gateways in one process do
not mix). ``observe_batch`` is an ``EvidenceGuard`` batch observer: it sees each batch of events once
written. ``write_seconds`` is the guard's timing of each evidence write. The gauges that describe
the state now -- approvals pending, upstream up/down, fsync lag -- are read when scraped
(``refresh``), from the callables the runtime gives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from drawbridge.gateway.pipeline.records import CallRecord

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """One gateway's metrics (module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "drawbridge_calls", "tools/call requests, by the decision's action and the call's outcome",
            ("action", "outcome"), registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "drawbridge_decision_seconds", "From taking a tools/call to its decision (approvals included)",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.forward_seconds = Histogram(
            "drawbridge_forward_seconds", "From forwarding a decided call to its upstream's answer",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.evidence_write_seconds = Histogram(
            "drawbridge_evidence_write_seconds", "Writing one batch of records to the evidence files",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.fsync_lag = Gauge(
            "drawbridge_evidence_fsync_lag_seconds", "Age of the oldest evidence line not yet fsynced",
            registry=self.registry,
        )
        self.approvals_pending = Gauge(
            "drawbridge_approvals_pending", "Approvals waiting for a person", registry=self.registry
        )
        self.upstream_up = Gauge(
            "drawbridge_upstream_up", "1 when the upstream is connected and serving, else 0", ("upstream",),
            registry=self.registry,
        )
        self.evidence_failed = Gauge(
            "drawbridge_evidence_failed", "1 once an evidence write failed (every call is then refused)",
            registry=self.registry,
        )
        self._children: dict[tuple[str, str], Any] = {}
        self.upstreams: Callable[[], Mapping[str, bool]] | None = None
        self.fsync_lag_seconds: Callable[[], float] | None = None
        self.evidence_broken: Callable[[], bool] | None = None

    def _child(self, action: str, outcome: str) -> Any:
        child = self._children.get((action, outcome))
        if child is None:
            child = self._children[(action, outcome)] = self.calls.labels(action, outcome)
        return child

    def observe_batch(self, events: Sequence[Any]) -> None:
        """Count the calls of one written batch (an ``EvidenceGuard`` batch observer)."""
        for event in events:
            if isinstance(event, CallRecord):
                self.observe(event)

    def observe(self, record: CallRecord) -> None:
        action = record.action.value if record.action is not None else "none"
        self._child(action, record.outcome.value).inc()
        if record.decision_ms is not None:
            self.decision_seconds.observe(record.decision_ms / 1000.0)
            if record.forwarded:
                self.forward_seconds.observe(max(record.latency_ms - record.decision_ms, 0.0) / 1000.0)

    def write_seconds(self, seconds: float) -> None:
        self.evidence_write_seconds.observe(seconds)

    def refresh(self, pending_approvals: int | None) -> None:
        """Read the gauges of the state now (at scrape time)."""
        if pending_approvals is not None:
            self.approvals_pending.set(pending_approvals)
        if self.upstreams is not None:
            for name, up in self.upstreams().items():
                self.upstream_up.labels(name).set(1 if up else 0)
        if self.fsync_lag_seconds is not None:
            self.fsync_lag.set(self.fsync_lag_seconds())
        if self.evidence_broken is not None:
            self.evidence_failed.set(1 if self.evidence_broken() else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "GatewayMetrics"]
