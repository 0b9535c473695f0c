"""The gateway's own counts render as prometheus_client's own metrics would: the same observations fed
to a ``prometheus_client.Histogram`` with the same buckets and to ``GatewayMetrics`` give the same
bucket, sum and count samples once both texts are parsed (boundary values included, since ``le`` is
inclusive), and the client library is loaded only by the first scrape."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, child_env, scaled
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from drawbridge.gateway.recording.metrics import LATENCY_BUCKETS, GatewayMetrics

OBSERVED = [0.0, 0.0004, 0.0005, 0.0007, 0.001, 0.003, 0.05, 0.0501, 2.5, 119.0, 120.0, 121.0, 0.02]


def samples(text: str, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_the_histograms_read_as_prometheus_client_s_own() -> None:
    registry = CollectorRegistry()
    reference = Histogram("drawbridge_evidence_write_seconds", "x", buckets=LATENCY_BUCKETS, registry=registry)
    ours = GatewayMetrics()
    for value in OBSERVED:
        reference.observe(value)
        ours.write_seconds(value)
    expected = samples(generate_latest(registry).decode(), "drawbridge_evidence_write_seconds")
    body, content_type = ours.exposition()
    got = samples(body.decode(), "drawbridge_evidence_write_seconds")
    assert got == expected and len(got) == len(LATENCY_BUCKETS) + 3  # buckets, +Inf, sum, count
    assert content_type.startswith("text/plain")


def test_counts_and_gauges() -> None:
    ours = GatewayMetrics()
    ours.calls[("allow", "ok")] = 3
    ours.upstreams = lambda: {"github": True, "gone": False}
    ours.evidence_broken = lambda: False
    ours.refresh(2)
    text = ours.exposition()[0].decode()
    assert samples(text, "drawbridge_calls")[("drawbridge_calls_total", (("action", "allow"), ("outcome", "ok")))] == 3
    up = samples(text, "drawbridge_upstream_up")
    assert up == {("drawbridge_upstream_up", (("upstream", "github"),)): 1, ("drawbridge_upstream_up", (("upstream", "gone"),)): 0}
    assert samples(text, "drawbridge_approvals_pending") == {("drawbridge_approvals_pending", ()): 2}


def test_the_client_library_is_loaded_by_the_first_scrape_only() -> None:
    probe = ("import sys\nfrom drawbridge.gateway.recording.metrics import GatewayMetrics\n"
             "m = GatewayMetrics(); m.write_seconds(0.1)\nprint('prometheus_client' in sys.modules)\n"
             "m.exposition()\nprint('prometheus_client' in sys.modules)\n")
    run = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=child_env(None), timeout=scaled(60))
    assert run.stdout.split() == ["False", "True"], run.stderr
