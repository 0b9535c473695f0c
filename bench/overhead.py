"""What the gateway adds to a tools/call: the same workload direct and through `drawbridge wrap`, in one run.

The workload is a small echo call driven over real pipes by a raw JSON-lines client (no client SDK
cost): by default the ``echo`` tool of ``@modelcontextprotocol/server-everything`` (installed by
scripts/test), or with ``--server raw`` bench/echo_server.py, a raw JSON-RPC echo whose own cost is
close to nothing, which gives the harshest ratio. The gateway runs the allow path with a policy file
and evidence on, in two configurations: the hash-chained trace and the surface records (what every
run writes), and the same plus truth carriers (opt-in). fsync as given, default ``batch``;
``always`` measures the disk too.

Prints p50/p99 latency of sequential calls, calls per second with many calls in flight, the CPU
time the gateway process spends per call (the steadiest figure on a busy machine), and the ratios to
direct (medians over rounds that alternate the configurations); then the policy engine's
evaluation time at 10, 100 and 1,000 rules.

    python bench/overhead.py [--server everything|raw] [--calls 2000] [--inflight 32] [--rounds 3] [--fsync batch]
        [--compare DIR]

``--compare DIR`` adds the same two gateway configurations run from another source tree (``DIR`` is
its ``src`` folder, for example a worktree of an earlier commit: ``git worktree add /tmp/before HEAD~1``
then ``--compare /tmp/before/src``), interleaved in the same rounds, so a change is measured against
what it changes in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from anyio.abc import Process

HERE = Path(__file__).resolve().parent
SERVERS = {
    # The published reference server's echo tool (Node.js, the TypeScript SDK).
    "everything": [str(HERE.parent / ".node" / "node_modules" / ".bin" / "mcp-server-everything"), "stdio"],
    # A raw JSON-RPC echo in Python: the cheapest possible upstream, the harshest ratio.
    "raw": [sys.executable, str(HERE / "echo_server.py")],
}


class Pipe:
    def __init__(self, process: Process) -> None:
        self.process = process
        self.buffer = b""

    async def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(message).encode() + b"\n")

    async def line(self) -> dict:
        assert self.process.stdout is not None
        while b"\n" not in self.buffer:
            self.buffer += await self.process.stdout.receive(65536)
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


WARM_UP = 300
"""Calls made before anything is measured (caches filled, code paths warm)."""


def _cpu_seconds(pid: int) -> float:
    """The user and system CPU time a process has used so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _session(
    argv: list[str], env: dict[str, str], calls: int, inflight: int
) -> tuple[list[float], float, float]:
    async with await anyio.open_process(argv, env=env, stderr=None) as process:
        pipe = Pipe(process)
        await pipe.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}}})
        await pipe.line()
        await pipe.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await pipe.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        await pipe.line()

        def call(i: int) -> dict:
            return {"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"message": f"hello {i}", "text": f"hello {i}"}}}

        for i in range(WARM_UP):
            await pipe.send(call(i))
            await pipe.line()
        cpu_before = _cpu_seconds(process.pid)
        latencies = []
        for i in range(calls):
            start = time.perf_counter()
            await pipe.send(call(i))
            answer = await pipe.line()
            latencies.append((time.perf_counter() - start) * 1000)
            assert "result" in answer and not answer["result"].get("isError"), answer
        # Throughput: keep `inflight` calls outstanding.
        start = time.perf_counter()
        sent = received = 0
        while sent < inflight:
            await pipe.send(call(sent))
            sent += 1
        while received < calls:
            await pipe.line()
            received += 1
            if sent < calls:
                await pipe.send(call(sent))
                sent += 1
        rate = calls / (time.perf_counter() - start)
        cpu_per_call = (_cpu_seconds(process.pid) - cpu_before) / (2 * calls)
        assert process.stdin is not None
        await process.stdin.aclose()
    return latencies, rate, cpu_per_call


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def policy_bench() -> list[tuple[int, float, float]]:
    from drawbridge.policy import PolicySource, evaluate, load_policies

    rows = []
    for count in (10, 100, 1000):
        rules = "\n".join(f'  - tools: ["tool_{i}", "ns{i}.*"]\n    action: deny' for i in range(count - 1))
        text = f'name: bench\nagent: "agent-*"\nrules:\n{rules}\n  - tools: ["echo"]\n    action: allow\n'
        policy_set = load_policies([PolicySource("bench.yaml", text)])
        assert evaluate(policy_set, "agent-1", "echo", {"text": "x"}).action.value == "allow"
        timings = {}
        for label, tool in (("first", "echo"), ("miss", "nothing_matches")):
            n = 20000
            start = time.perf_counter()
            for _ in range(n):
                evaluate(policy_set, "agent-1", tool, {"text": "x"})
            timings[label] = (time.perf_counter() - start) / n * 1e6
        # A cold decision: a new (agent, tool) pair each time, so no memoized candidate list helps.
        n = 2000
        start = time.perf_counter()
        for i in range(n):
            evaluate(policy_set, f"agent-{i}", "echo", {"text": "x"})
        cold = (time.perf_counter() - start) / n * 1e6
        rows.append((count, timings["first"], cold))
    return rows


CONFIGS = ("direct", "evidence", "evidence+carriers")
"""direct: the server alone; evidence: through the gateway with the trace and surface records (what
every run writes); evidence+carriers: the same plus tool-decision truth carriers (opt-in)."""
COMPARED = " (compared)"
"""The suffix of a configuration run from the ``--compare`` tree."""


def _gateway(tmp: Path, config: str, fsync: str, echo: list[str]) -> list[str]:
    policy = tmp / "policies"
    policy.mkdir(exist_ok=True)
    (policy / "bench.yaml").write_text('name: bench\nagent: "*"\nrules:\n  - tools: ["echo"]\n    action: allow\n')
    argv = [sys.executable, "-m", "drawbridge", "wrap", "--policy", str(policy), "--agent", "bench",
            "--evidence-dir", str(tmp / "evidence"), "--fsync", fsync]
    if config.removesuffix(COMPARED) == "evidence+carriers":
        argv += ["--tool-decision-truth-out", str(tmp / "carriers.ndjson")]
    return [*argv, "--", *echo]


async def main_async(args: argparse.Namespace) -> None:
    env = dict(os.environ)
    env["DRAWBRIDGE_TDT_HMAC_KEY"] = "bench-key-0123456789abcdef"
    env["DRAWBRIDGE_TDT_HMAC_KEY_ID"] = "bench-kid"
    echo = SERVERS[args.server]
    configs = list(CONFIGS)
    if args.compare:
        configs += [f"{config}{COMPARED}" for config in CONFIGS if config != "direct"]
    latencies: dict[str, list[float]] = {config: [] for config in configs}
    rates: dict[str, list[float]] = {config: [] for config in configs}
    cpu: dict[str, list[float]] = {config: [] for config in configs}
    entries = 0
    # Rounds alternate the configurations, so that whatever else the machine does at the time
    # weighs on all of them alike; each figure is the median over the rounds.
    for _ in range(args.rounds):
        for config in configs:
            with tempfile.TemporaryDirectory() as tmp:
                argv = echo if config == "direct" else _gateway(Path(tmp), config, args.fsync, echo)
                run_env = env
                if config.endswith(COMPARED):
                    run_env = {**env, "PYTHONPATH": str(Path(args.compare).resolve())}
                lat, rate, cpu_per_call = await _session(argv, run_env, args.calls, args.inflight)
                latencies[config].extend(lat)
                rates[config].append(rate)
                cpu[config].append(cpu_per_call)
                if config != "direct":
                    entries += sum(1 for _ in open(Path(tmp) / "evidence" / "trace.ndjson", "rb"))
    print(f"upstream: {args.server}; tools/call echo, {args.calls} sequential calls and {args.calls} with "
          f"{args.inflight} in flight, per configuration and round; {args.rounds} rounds; gateway: allow path, "
          f"fsync={args.fsync} ({entries} trace entries written)")
    direct_p50 = _pct(latencies["direct"], 0.5)
    direct_p99 = _pct(latencies["direct"], 0.99)
    direct_rate = statistics.median(rates["direct"])
    if args.compare:
        print(f"compared tree: {Path(args.compare).resolve()}")
    print(f"{'':<31}{'p50 ms':>10}{'p99 ms':>10}{'calls/s':>12}{'added p50':>12}{'throughput':>12}{'CPU us/call':>13}")
    for config in configs:
        p50, p99 = _pct(latencies[config], 0.5), _pct(latencies[config], 0.99)
        rate = statistics.median(rates[config])
        added = "" if config == "direct" else f"{p50 - direct_p50:>12.3f}"
        ratio = "" if config == "direct" else f"{rate / direct_rate:>12.2f}"
        per_call = statistics.median(cpu[config]) * 1e6
        print(f"{config:<31}{p50:>10.3f}{p99:>10.3f}{rate:>12.0f}{added:>12}{ratio:>12}{per_call:>13.0f}")
    print(f"(added p50 in ms over direct; throughput as a ratio of direct's; CPU: the process's own user+system "
          f"time per call after the warm-up (direct: the server's; else the gateway's); direct p99 {direct_p99:.3f} ms; "
          f"calls/s per round: " + "; ".join(f"{c} " + ", ".join(f"{r:.0f}" for r in rates[c]) for c in configs) + ")")
    print()
    print(f"{'policy evaluation':<22}{'repeat us':>12}{'cold us':>12}")
    for count, warm, cold in policy_bench():
        print(f"{f'{count} rules':<22}{warm:>12.2f}{cold:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument("--server", choices=sorted(SERVERS), default="everything",
                        help="everything: server-everything's echo (default); raw: a minimal Python echo")
    parser.add_argument("--compare", metavar="DIR",
                        help="also run the gateway from this source tree (its src folder), in the same rounds")
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
