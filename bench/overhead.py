"""What the gateway adds to a tools/call: the same workload direct, through a bare relay and through
drawbridge, in one run (configurations interleaved, several rounds, medians).

stdio mode (the default) drives ``drawbridge wrap`` over real pipes. The workload is the ``echo`` tool
of ``@modelcontextprotocol/server-everything`` (installed by scripts/test), or with ``--server raw``
bench/echo_server.py, a raw JSON-RPC echo whose own cost is close to nothing (the harshest ratio).
Configurations: ``direct`` (the server alone), ``relay`` (bench/line_relay.py, a bare asyncio line
relay: the floor for any Python process in between), ``decisions`` (wrap on the allow path with a
policy file and no evidence: what deciding costs alone), ``evidence`` (the same with the hash-chained
trace and the surface records: what every run writes) and ``evidence+carriers`` (the same plus
tool-decision truth carriers, opt-in). fsync as given, default ``batch``.

Each session measures: back-to-back sequential calls (p50/p99), calls spaced ``--spacing-ms`` apart as
an agent spaces them, calls per second with ``--inflight`` outstanding, the CPU the process under test
spends per call, the time from spawn to the initialize answer, and (last round) its RSS after
``--rss-calls`` calls. The client is raw by default (bench/raw_client.py: blocking pipe reads and
writes, lines built once, so the client hides nothing); ``--client anyio`` is the earlier anyio client
(sequential and in-flight figures only).

http mode compares ``drawbridge serve`` over streamable HTTP (server-everything over stdio behind it,
evidence on) with server-everything's own HTTP transport (``streamableHttp``): sequential p50 on one
kept-alive session, calls per second over ``--sessions`` sessions calling at once, RSS, spawn to the
initialize answer.

    python bench/overhead.py [--mode stdio|http] [--client raw|anyio] [--server everything|raw]
        [--calls 2000] [--spaced-calls 200] [--spacing-ms 10] [--inflight 32] [--sessions 16]
        [--rounds 3] [--rss-calls 20000] [--fsync batch] [--compare DIR]

``--compare DIR`` adds the gateway configurations run from another source tree (``DIR`` is its ``src``
folder, for example ``git worktree add /tmp/before HEAD~1`` then ``--compare /tmp/before/src``),
interleaved in the same rounds, so a change is measured against what it changes in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead_http import run_http  # noqa: E402
from raw_client import RawStdioClient, cpu_seconds, rss_kib, tree_env  # noqa: E402

HERE = Path(__file__).resolve().parent
NODE_BIN = HERE.parent / ".node" / "node_modules" / ".bin"
SERVERS = {
    # The published reference server's echo tool (Node.js, the TypeScript SDK).
    "everything": [str(NODE_BIN / "mcp-server-everything"), "stdio"],
    # A raw JSON-RPC echo in Python: the cheapest possible upstream, the harshest ratio.
    "raw": [sys.executable, str(HERE / "echo_server.py")],
}
WARM_UP = 300
"""Calls made before anything is measured (caches filled, code paths warm)."""
CONFIGS = ("direct", "relay", "decisions", "evidence", "evidence+carriers")
COMPARED = " (compared)"
"""The suffix of a configuration run from the ``--compare`` tree."""


@dataclass
class Figures:
    """One configuration's measurements, over all rounds."""

    latencies: list[float] = field(default_factory=list)
    spaced: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    spawn: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    """MiB, after ``--rss-calls`` calls (last round)."""
    rss_calls: int = 0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def raw_session(argv: list[str], env: dict[str, str], args: argparse.Namespace, figures: Figures, last: bool) -> None:
    client = RawStdioClient(argv, env)
    try:
        figures.spawn.append(client.initialize())
        for _ in range(WARM_UP):
            client.call()
        cpu_before = cpu_seconds(client.pid)
        for _ in range(args.calls):
            figures.latencies.append(client.call())
        for _ in range(args.spaced_calls):
            client.idle(args.spacing_ms / 1000)
            figures.spaced.append(client.call())
        figures.rates.append(client.pipelined(args.calls, args.inflight))
        figures.cpu.append((cpu_seconds(client.pid) - cpu_before) / (2 * args.calls + args.spaced_calls))
        if last:
            done = WARM_UP + 2 * args.calls + args.spaced_calls
            if args.rss_calls > done:
                client.pipelined(args.rss_calls - done, args.inflight)
            figures.rss.append(rss_kib(client.pid) / 1024)
            figures.rss_calls = max(done, args.rss_calls)
    finally:
        client.close()


def anyio_session(argv: list[str], env: dict[str, str], args: argparse.Namespace, figures: Figures, last: bool) -> None:
    from overhead_anyio import session

    lat, rate, cpu_per_call = session(argv, env, args.calls, args.inflight, WARM_UP)
    figures.latencies.extend(lat)
    figures.rates.append(rate)
    figures.cpu.append(cpu_per_call)


def _gateway(tmp: Path, config: str, fsync: str, echo: list[str]) -> list[str]:
    policy = tmp / "policies"
    policy.mkdir(exist_ok=True)
    (policy / "bench.yaml").write_text('name: bench\nagent: "*"\nrules:\n  - tools: ["echo"]\n    action: allow\n')
    argv = [sys.executable, "-m", "drawbridge", "wrap", "--policy", str(policy), "--agent", "bench"]
    if config.removesuffix(COMPARED) != "decisions":
        argv += ["--evidence-dir", str(tmp / "evidence"), "--fsync", fsync]
    if config.removesuffix(COMPARED) == "evidence+carriers":
        argv += ["--tool-decision-truth-out", str(tmp / "carriers.ndjson")]
    return [*argv, "--", *echo]


def _argv(config: str, tmp: Path, args: argparse.Namespace) -> list[str]:
    echo = SERVERS[args.server]
    if config == "direct":
        return echo
    if config == "relay":
        return [sys.executable, str(HERE / "line_relay.py"), "--", *echo]
    return _gateway(tmp, config, args.fsync, echo)


def run_stdio(args: argparse.Namespace, env: dict[str, str]) -> None:
    configs = list(CONFIGS)
    if args.compare:
        configs += [f"{config}{COMPARED}" for config in CONFIGS if config not in ("direct", "relay")]
    figures = {config: Figures() for config in configs}
    session = raw_session if args.client == "raw" else anyio_session
    entries = 0
    # Rounds alternate the configurations, so that whatever else the machine does at the time
    # weighs on all of them alike; each figure is the median over the rounds.
    for round_index in range(args.rounds):
        for config in configs:
            with tempfile.TemporaryDirectory() as tmp:
                run_env = tree_env(env, args.compare if config.endswith(COMPARED) else None)
                session(_argv(config, Path(tmp), args), run_env, args, figures[config], round_index == args.rounds - 1)
                trace = Path(tmp) / "evidence" / "trace.ndjson"
                if trace.exists():
                    entries += sum(1 for _ in open(trace, "rb"))
    print(f"stdio, {args.client} client, upstream {args.server}: tools/call echo; per configuration and round "
          f"{args.calls} back-to-back, {args.spaced_calls} spaced {args.spacing_ms:g} ms, {args.calls} with "
          f"{args.inflight} in flight; {args.rounds} rounds; gateway allow path, fsync={args.fsync} "
          f"({entries} trace entries written)")
    if args.compare:
        print(f"compared tree: {Path(args.compare).resolve()}")
    direct, relay = figures["direct"], figures["relay"]
    d50, r50 = pct(direct.latencies, 0.5), pct(relay.latencies, 0.5)
    ds50, rs50 = pct(direct.spaced, 0.5), pct(relay.spaced, 0.5)
    d_rate = median(direct.rates)
    print(f"{'':<28}{'p50':>8}{'p99':>8}{'added':>8}{'/relay':>8}{'spaced':>8}{'added':>8}{'/relay':>8}"
          f"{'calls/s':>9}{'/direct':>8}{'CPU us':>8}{'RSS MiB':>9}{'spawn s':>9}")
    for config in configs:
        f = figures[config]
        p50, s50 = pct(f.latencies, 0.5), pct(f.spaced, 0.5)
        added = p50 - d50 if config != "direct" else float("nan")
        added_s = s50 - ds50 if config != "direct" else float("nan")
        ratio = added / (r50 - d50) if config not in ("direct", "relay") else float("nan")
        ratio_s = added_s / (rs50 - ds50) if config not in ("direct", "relay") else float("nan")
        rate = median(f.rates)
        print(f"{config:<28}{p50:>8.3f}{pct(f.latencies, 0.99):>8.3f}{added:>8.3f}{ratio:>8.2f}{s50:>8.3f}"
              f"{added_s:>8.3f}{ratio_s:>8.2f}{rate:>9.0f}{rate / d_rate:>8.2f}{median(f.cpu) * 1e6:>8.0f}"
              f"{median(f.rss):>9.1f}{median(f.spawn):>9.3f}")
    if "evidence+carriers" in figures:
        carriers = pct(figures["evidence+carriers"].latencies, 0.5) - pct(figures["evidence"].latencies, 0.5)
        print(f"truth carriers add {carriers:+.3f} ms p50 over evidence")
    print(f"(ms; added: p50 over direct's; /relay: added p50 as a ratio of the bare relay's; spaced: calls "
          f"{args.spacing_ms:g} ms apart; /direct: calls/s with {args.inflight} in flight as a ratio of direct's; CPU: "
          f"the process's own user+system time per call after the warm-up (direct: the server's, else the relay's "
          f"or the gateway's, without its child); RSS after {max(f.rss_calls for f in figures.values())} calls; "
          f"spawn: to the initialize answer. calls/s per round: "
          + "; ".join(f"{c} " + ", ".join(f"{r:.0f}" for r in figures[c].rates) for c in configs) + ")")


def policy_bench() -> list[tuple[int, float, float]]:
    from drawbridge.policy import PolicySource, evaluate, load_policies

    rows = []
    for count in (10, 100, 1000):
        rules = "\n".join(f'  - tools: ["tool_{i}", "ns{i}.*"]\n    action: deny' for i in range(count - 1))
        text = f'name: bench\nagent: "agent-*"\nrules:\n{rules}\n  - tools: ["echo"]\n    action: allow\n'
        policy_set = load_policies([PolicySource("bench.yaml", text)])
        assert evaluate(policy_set, "agent-1", "echo", {"text": "x"}).action.value == "allow"
        n = 20000
        start = time.perf_counter()
        for _ in range(n):
            evaluate(policy_set, "agent-1", "echo", {"text": "x"})
        warm = (time.perf_counter() - start) / n * 1e6
        # A cold decision: a new (agent, tool) pair each time, so no memoized candidate list helps.
        n = 2000
        start = time.perf_counter()
        for i in range(n):
            evaluate(policy_set, f"agent-{i}", "echo", {"text": "x"})
        rows.append((count, warm, (time.perf_counter() - start) / n * 1e6))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--client", choices=["raw", "anyio"], default="raw")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--spaced-calls", type=int, default=200)
    parser.add_argument("--spacing-ms", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--http-calls", type=int, default=500, help="http mode: sequential calls per round")
    parser.add_argument("--sessions", type=int, default=16, help="http mode: sessions calling at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-calls", type=int, default=20000, help="calls made before RSS is read (last round)")
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument("--server", choices=sorted(SERVERS), default="everything",
                        help="stdio mode: everything: server-everything's echo (default); raw: a minimal Python echo")
    parser.add_argument("--compare", metavar="DIR",
                        help="also run the gateway from this source tree (its src folder), in the same rounds")
    parser.add_argument("--no-policy", action="store_true", help="skip the policy evaluation figures")
    args = parser.parse_args()
    env = dict(os.environ)
    env["DRAWBRIDGE_TDT_HMAC_KEY"] = "bench-key-0123456789abcdef-0123456789"
    env["DRAWBRIDGE_TDT_HMAC_KEY_ID"] = "bench-kid"
    if args.mode == "http":
        run_http(args, env, NODE_BIN, pct, median)
    else:
        run_stdio(args, env)
    if not args.no_policy:
        print()
        print(f"{'policy evaluation':<22}{'repeat us':>12}{'cold us':>12}")
        for count, warm, cold in policy_bench():
            print(f"{f'{count} rules':<22}{warm:>12.2f}{cold:>12.2f}")


if __name__ == "__main__":
    main()
