"""The gateway's Prometheus metrics: what ``/metrics`` on the control plane shows.

Invariant: a metric carries names the operator chose or the gateway defines -- action, outcome,
upstream name -- never an agent-supplied value (no tool name, no agent id: those would let an agent
grow the label space without bound) and never an argument. Observing a call costs a dictionary
increment and two bucket searches in plain Python; ``prometheus_client`` (some 14 MiB resident) is
loaded with the first scrape, so a gateway nobody scrapes never holds it.

Theory of operation. ``GatewayMetrics`` keeps its own counts (two gateways in one process do not
mix). ``observe_batch`` is an ``EvidenceGuard`` batch observer: it sees each batch of events once
written (with a shadow policy, ``shadow_calls`` counts its verdicts too: action and shadow action
only). ``write_seconds`` is the guard's timing of each evidence write. The gauges that describe
the state now -- approvals pending, upstream up/down, fsync lag -- are read when scraped
(``refresh``), from the callables the runtime gives. ``exposition`` hands the counts to
``prometheus_client`` as metric families of a collector and returns its text format.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from drawbridge.gateway.pipeline.records import CallRecord
from drawbridge.gateway.recording.shadow_tally import counted_shadow

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


class Buckets:
    """A latency histogram: counts per upper bound (``le``, as Prometheus reads them), sum and count."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def cumulative(self, bound_text: Callable[[float], str]) -> list[tuple[str, float]]:
        total, out = 0, []
        for bound, count in zip((*map(bound_text, LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, float(total)))
        return out


HISTOGRAMS: Final = {
    "decision": ("drawbridge_decision_seconds", "From taking a tools/call to its decision (approvals included)"),
    "forward": ("drawbridge_forward_seconds", "From forwarding a decided call to its upstream's answer"),
    "evidence_write": ("drawbridge_evidence_write_seconds", "Writing one batch of records to the evidence files"),
}
GAUGES: Final = {
    "drawbridge_evidence_fsync_lag_seconds": "Age of the oldest evidence line not yet fsynced",
    "drawbridge_approvals_pending": "Approvals waiting for a person",
    "drawbridge_evidence_failed": "1 once an evidence write failed (every call is then refused)",
}


class GatewayMetrics:
    """One gateway's metrics (module docstring)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], int] = {}
        self.histograms = {key: Buckets() for key in HISTOGRAMS}
        self._decision, self._forward = self.histograms["decision"], self.histograms["forward"]
        self._write = self.histograms["evidence_write"]
        self.gauges: dict[str, float] = {}
        self.upstream_up: dict[str, float] = {}
        self.upstreams: Callable[[], Mapping[str, bool]] | None = None
        self.fsync_lag_seconds: Callable[[], float] | None = None
        self.evidence_broken: Callable[[], bool] | None = None
        self.shadow_calls: dict[tuple[str, str], int] | None = None
        """With a shadow policy: calls by the enforced policy's action and the shadow's."""
        self.result_guard: dict[tuple[str, str], int] = {}
        """What ``result_guards`` did, by action and kind (a detector's name, ``size``): operator-chosen names."""

    def observe_batch(self, events: Sequence[Any]) -> None:
        """Count the calls of one written batch (an ``EvidenceGuard`` batch observer)."""
        for event in events:
            if isinstance(event, CallRecord):
                self.observe(event)

    def observe(self, record: CallRecord) -> None:
        key = (record.action.value if record.action is not None else "none", record.outcome.value)
        self.calls[key] = self.calls.get(key, 0) + 1
        shadow = counted_shadow(record) if self.shadow_calls is not None else None
        if shadow is not None and self.shadow_calls is not None:
            pair = (shadow.policy_action.value, shadow.shown)
            self.shadow_calls[pair] = self.shadow_calls.get(pair, 0) + 1
        if record.result_guard is not None:
            for action, kind, count in record.result_guard.counts():
                self.result_guard[(action, kind)] = self.result_guard.get((action, kind), 0) + count
        if record.decision_ms is not None:
            self._decision.observe(record.decision_ms / 1000.0)
            if record.forwarded:
                self._forward.observe(max(record.latency_ms - record.decision_ms, 0.0) / 1000.0)

    def write_seconds(self, seconds: float) -> None:
        self._write.observe(seconds)

    def refresh(self, pending_approvals: int | None) -> None:
        """Read the gauges of the state now (at scrape time)."""
        if pending_approvals is not None:
            self.gauges["drawbridge_approvals_pending"] = pending_approvals
        if self.upstreams is not None:
            self.upstream_up.update({name: 1 if up else 0 for name, up in self.upstreams().items()})
        if self.fsync_lag_seconds is not None:
            self.gauges["drawbridge_evidence_fsync_lag_seconds"] = self.fsync_lag_seconds()
        if self.evidence_broken is not None:
            self.gauges["drawbridge_evidence_failed"] = 1 if self.evidence_broken() else 0

    def collect(self) -> Iterator[Any]:
        """The metric families, for ``prometheus_client`` (a custom collector's ``collect``)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        calls = CounterMetricFamily(
            "drawbridge_calls", "tools/call requests, by the decision's action and the call's outcome",
            labels=("action", "outcome"),
        )
        for (action, outcome), count in sorted(self.calls.items()):
            calls.add_metric((action, outcome), count)
        yield calls
        if self.shadow_calls is not None:
            shadow = CounterMetricFamily(
                "drawbridge_shadow_calls", "tools/call requests the shadow policy decided too, by the enforced "
                "policy's action and the shadow's (failed: the shadow could not decide)",
                labels=("action", "shadow_action"),
            )
            for (action, shadow_action), count in sorted(self.shadow_calls.items()):
                shadow.add_metric((action, shadow_action), count)
            yield shadow
        if self.result_guard:
            guard = CounterMetricFamily(
                "drawbridge_result_guard", "What result_guards did to tool results: secrets redacted or refused "
                "by kind, results truncated or refused by size", labels=("action", "kind"),
            )
            for (action, kind), count in sorted(self.result_guard.items()):
                guard.add_metric((action, kind), count)
            yield guard
        for key, (name, documentation) in HISTOGRAMS.items():
            buckets = self.histograms[key]
            yield HistogramMetricFamily(name, documentation, buckets=buckets.cumulative(floatToGoString), sum_value=buckets.sum)
        for name, documentation in GAUGES.items():
            yield GaugeMetricFamily(name, documentation, value=self.gauges.get(name, 0))
        up = GaugeMetricFamily(
            "drawbridge_upstream_up", "1 when the upstream is connected and serving, else 0", labels=("upstream",)
        )
        for name, value in sorted(self.upstream_up.items()):
            up.add_metric((name,), value)
        yield up

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type (the installed ``prometheus_client``'s)."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["GatewayMetrics", "LATENCY_BUCKETS"]
