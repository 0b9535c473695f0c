"""What the gateway adds to a tools/call: the same workload direct and through `drawbridge wrap`, in one run.

The workload is a small echo call driven over real pipes by a raw JSON-lines client (no client SDK
cost): by default the ``echo`` tool of ``@modelcontextprotocol/server-everything`` (installed by
scripts/test), or with ``--server raw`` bench/echo_server.py, a raw JSON-RPC echo whose own cost is
close to nothing, which gives the harshest ratio. The gateway runs
the allow path with evidence on: a policy file, the hash-chained trace, surface records and truth
carriers (fsync as given, default ``batch``; ``always`` measures the disk too).

Prints p50/p99 latency of sequential calls, calls per second with many calls in flight, and the
ratios gateway/direct; then the policy engine's evaluation time at 10, 100 and 1,000 rules.

    python bench/overhead.py [--server everything|raw] [--calls 2000] [--inflight 32] [--fsync batch]
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


async def _session(argv: list[str], env: dict[str, str], calls: int, inflight: int) -> tuple[list[float], float]:
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

        for i in range(300):  # warm-up
            await pipe.send(call(i))
            await pipe.line()
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
        assert process.stdin is not None
        await process.stdin.aclose()
    return latencies, rate


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


async def main_async(args: argparse.Namespace) -> None:
    env = dict(os.environ)
    env["DRAWBRIDGE_TDT_HMAC_KEY"] = "bench-key-0123456789abcdef"
    env["DRAWBRIDGE_TDT_HMAC_KEY_ID"] = "bench-kid"
    echo = SERVERS[args.server]
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policies"
        policy.mkdir()
        (policy / "bench.yaml").write_text('name: bench\nagent: "*"\nrules:\n  - tools: ["echo"]\n    action: allow\n')
        gateway = [sys.executable, "-m", "drawbridge", "wrap", "--policy", str(policy), "--agent", "bench",
                   "--evidence-dir", str(Path(tmp) / "evidence"), "--tool-decision-truth-out",
                   str(Path(tmp) / "carriers.ndjson"), "--fsync", args.fsync, "--", *echo]
        direct_lat, direct_rate = await _session(echo, env, args.calls, args.inflight)
        gw_lat, gw_rate = await _session(gateway, env, args.calls, args.inflight)
        entries = sum(1 for _ in open(Path(tmp) / "evidence" / "trace.ndjson", "rb"))
    d50, d99, g50, g99 = (_pct(direct_lat, 0.5), _pct(direct_lat, 0.99), _pct(gw_lat, 0.5), _pct(gw_lat, 0.99))
    print(f"upstream: {args.server}; tools/call echo, {args.calls} sequential calls; throughput with {args.inflight} in flight; "
          f"gateway: allow path, evidence on (fsync={args.fsync}, {entries} trace entries written)")
    print(f"{'':<22}{'p50 ms':>10}{'p99 ms':>10}{'calls/s':>12}")
    print(f"{'direct':<22}{d50:>10.3f}{d99:>10.3f}{direct_rate:>12.0f}")
    print(f"{'through drawbridge':<22}{g50:>10.3f}{g99:>10.3f}{gw_rate:>12.0f}")
    print(f"{'added latency':<22}{g50 - d50:>10.3f}{g99 - d99:>10.3f}")
    print(f"{'ratio gateway/direct':<22}{g50 / d50:>10.2f}{g99 / d99:>10.2f}{gw_rate / direct_rate:>12.2f}")
    print(f"median of per-call latency stdev: direct {statistics.pstdev(direct_lat):.3f} ms, "
          f"gateway {statistics.pstdev(gw_lat):.3f} ms")
    print()
    print(f"{'policy evaluation':<22}{'repeat us':>12}{'cold us':>12}")
    for count, warm, cold in policy_bench():
        print(f"{f'{count} rules':<22}{warm:>12.2f}{cold:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument("--server", choices=sorted(SERVERS), default="everything",
                        help="everything: server-everything's echo (default); raw: a minimal Python echo")
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
