"""State on PostgreSQL against SQLite, and two replicas against one, in one run.

Every configuration runs `drawbridge serve` over HTTP in front of bench/echo_server.py, on a path
that reads and writes the state on every call: the tool is `human_approval`, lifted by a standing
grant (a grant lookup per call), under a per-agent rate limit (a token taken per call). Configurations:

* ``no state``: the same tool allowed by the policy, no rate limit (the allow path: the reference);
* ``sqlite``: one gateway, state in its SQLite file (grants in SQLite, buckets in memory);
* ``postgresql``: one replica on PostgreSQL (grants and buckets in the database);
* ``2 replicas``: two replicas on one PostgreSQL, the clients split between them.

Clients send raw 2026-07-28 requests over HTTP (stateless: any replica serves any request). Prints,
per configuration, p50/p99 latency of sequential calls and calls per second with ``--inflight``
calls in flight, and the added latency against ``no state``; then, in process and without HTTP, the
microseconds of each state operation a stateful call makes, on SQLite and on PostgreSQL. A throwaway PostgreSQL cluster is made
for the run (initdb and pg_ctl, as the ``postgres`` user when run as root) and removed after.

    python bench/replicas.py [--calls 1000] [--inflight 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import httpx

HERE = Path(__file__).resolve().parent
ECHO = [sys.executable, str(HERE / "echo_server.py")]
URL_LINE = re.compile(r"serving \d+ upstream\(s\) on (http://\S+/mcp)")
CONTROL_LINE = re.compile(r"control plane on (http://\S+) ")
ADMIN = "bench-admin-token"
KEYS = {"BENCH_BIND_KEY": secrets.token_hex(32), "BENCH_STATE_KEY": secrets.token_hex(32)}
HEADERS = {
    "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call", "Mcp-Name": "echo.echo",
}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def _pg_bin(name: str) -> str:
    return shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def postgres() -> Iterator[str]:
    """A throwaway cluster; yields a database URL."""
    root = Path(tempfile.mkdtemp(prefix="drawbridge-bench-pg-"))
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        owner = pwd.getpwnam(user)
        os.chown(root, owner.pw_uid, owner.pw_gid)
    port, data = _port(), root / "data"

    def run(*argv: str) -> None:
        subprocess.run(list(argv), user=user, check=True, capture_output=True, cwd=root, timeout=120)

    try:
        run(_pg_bin("initdb"), "-D", str(data), "-U", "drawbridge", "--auth=trust", "--no-sync")
        run(_pg_bin("pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "start",
            "-o", f"-p {port} -c listen_addresses=127.0.0.1 -k {root}")
        yield f"postgresql://drawbridge@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([_pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], user=user,
                       capture_output=True, cwd=root, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _config(directory: Path, name: str, state: str | None) -> Path:
    rule = "allow" if state is None else "human_approval"
    (directory / "policies").mkdir(parents=True)
    (directory / "policies" / "p.yaml").write_text(
        f"name: p\nagent: '*'\nrules:\n  - tools: ['echo.*']\n    action: {rule}\n", encoding="utf-8")
    document: dict = {
        "upstreams": [{"name": "echo", "transport": "stdio", "command": ECHO[0], "args": ECHO[1:]}],
        "policy_dir": "./policies", "evidence_dir": "./evidence", "state_path": "./drawbridge.db",
        "listen": {"port": 0}, "control": {"port": 0}, "fsync": "batch",
        "auth": {"anonymous_agent": "bench", "admin": {"token_env": "BENCH_ADMIN"}},
    }
    if state is not None:
        document["rate_limits"] = {"per_agent": {"rate": 1e6, "burst": 1000000}}
    if state not in (None, "sqlite"):
        document["state"] = state
        document["replica"] = {"id": name, "keys": {
            "approval_binding": [{"id": "b1", "env": "BENCH_BIND_KEY"}],
            "request_state": [{"id": "s1", "env": "BENCH_STATE_KEY"}],
        }}
    path = directory / "drawbridge.yaml"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@contextmanager
def gateway(directory: Path, name: str, state: str | None) -> Iterator[tuple[str, str]]:
    """A serve process; yields its /mcp URL and control plane URL."""
    config = _config(directory / name, name, state)
    env = {**os.environ, **KEYS, "BENCH_ADMIN": ADMIN, "PYTHONPATH": str(HERE.parent / "src")}
    process = subprocess.Popen([sys.executable, "-m", "drawbridge", "serve", "--config", str(config)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seen: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # read every line, so the gateway never blocks on a full pipe
        assert process.stderr is not None
        for raw in process.stderr:
            seen.append(raw.decode(errors="replace"))
            text = "".join(seen)
            if URL_LINE.search(text) and CONTROL_LINE.search(text):
                ready.set()
        ready.set()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        ready.wait(60)
        text = "".join(seen)
        url, control = URL_LINE.search(text), CONTROL_LINE.search(text)
        if url is None or control is None:
            raise SystemExit(f"the gateway {name} did not start:\n{''.join(seen[-5:])}")
        yield url.group(1), control.group(1)
    finally:
        process.terminate()
        process.wait(15)


async def _call(http: httpx.AsyncClient, url: str, i: int) -> None:
    params = {"name": "echo.echo", "arguments": {"text": f"call {i}"}, "_meta": ENVELOPE}
    response = await http.post(url, json={"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params},
                               headers=HEADERS)
    if '"isError":true' in response.text or '"error"' in response.text:
        raise SystemExit(f"a call failed: {response.text[:300]}")


async def measure(urls: list[str], calls: int, inflight: int) -> tuple[float, float, float]:
    """(p50 ms, p99 ms) of sequential calls, and calls/s with ``inflight`` in flight."""
    async with httpx.AsyncClient(trust_env=False, timeout=60, limits=httpx.Limits(max_connections=inflight * 2)) as http:
        for i in range(20):  # warm up every replica
            await _call(http, urls[i % len(urls)], i)
        latencies = []
        for i in range(calls // 4):
            start = time.perf_counter()
            await _call(http, urls[i % len(urls)], i)
            latencies.append((time.perf_counter() - start) * 1000)
        latencies.sort()
        queue = iter(range(calls))
        start = time.perf_counter()

        async def worker(w: int) -> None:
            for i in queue:
                await _call(http, urls[(w + i) % len(urls)], i)

        async with anyio.create_task_group() as tg:
            for w in range(inflight):
                tg.start_soon(worker, w)
        rate = calls / (time.perf_counter() - start)
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1], rate


async def grant(control: str) -> None:
    async with httpx.AsyncClient(trust_env=False, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        response = await http.post(f"{control}/grants", json={"agent": "bench", "tools": "echo.*", "duration": "1h"})
        response.raise_for_status()


def run_config(label: str, state: str | None, replicas: int, args: argparse.Namespace, tmp: Path) -> tuple:
    with ExitStack() as stack:
        started = [stack.enter_context(gateway(tmp / label.replace(" ", "-"), f"r{n}", state)) for n in range(replicas)]
        if state is not None:
            anyio.run(grant, started[0][1])
        return anyio.run(measure, [url for url, _ in started], args.calls, args.inflight)


async def state_ops(location: str, ops: int) -> dict[str, float]:
    """Microseconds per state operation on one backend, in process (no HTTP): what a stateful call adds."""
    from datetime import UTC, datetime, timedelta

    from drawbridge.config_rates import Bucket, RateLimits
    from drawbridge.gateway.pipeline.rate_limits import rate_limiter
    from drawbridge.gateway.pipeline.tool_call import ToolCall
    from drawbridge.state.approval_uses import SqliteApprovalUses
    from drawbridge.state.approvals import SqliteApprovalStore
    from drawbridge.state.backend import open_backend
    from drawbridge.state.grants import SqliteGrantStore

    db = open_backend(location, replica_id="bench")
    try:
        now = datetime.now(UTC)
        grants, approvals, uses = SqliteGrantStore(db), SqliteApprovalStore(db), SqliteApprovalUses(db)
        await grants.create("bench", "echo.*", now + timedelta(hours=1), "bench", created_at=now)
        limiter = rate_limiter(RateLimits(per_agent=Bucket(1e9, 10**9)), db)
        assert limiter is not None
        call = ToolCall(agent="bench", tool="echo.echo", arguments={}, meta=None, request_id=1)
        out: dict[str, float] = {}

        async def grant_lookup() -> None:
            await grants.active_for("bench", "echo.echo", now)

        async def rate_check() -> None:
            await limiter.check(call)

        async def approval_cycle() -> None:
            asked = await approvals.submit(agent="bench", tool="echo.echo", args_digest="hmac-sha256:b1:" + "0" * 64,
                                           args_shape=None, reason="bench", created_at=now,
                                           expires_at=now + timedelta(minutes=5))
            await approvals.resolve(asked.id, "approved", resolved_by="op", channel="control_plane", at=now)
            await uses.claim(asked.id, at=now)

        for name, op, count in (("grant lookup", grant_lookup, ops), ("rate-limit token", rate_check, ops),
                                ("approval ask+resolve+use", approval_cycle, max(ops // 5, 1))):
            start = time.perf_counter()
            for _ in range(count):
                await op()
            out[name] = (time.perf_counter() - start) / count * 1e6
        return out
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ops", type=int, default=500, help="state operations per kind, in process")
    args = parser.parse_args()
    results: dict[str, list[tuple]] = {}
    with postgres() as base_url, tempfile.TemporaryDirectory(prefix="drawbridge-bench-") as tmp:
        import psycopg

        for round_ in range(args.rounds):
            configs = [("no state", None, 1), ("sqlite", "sqlite", 1)]
            for label, replicas in (("postgresql", 1), ("2 replicas", 2)):
                database = f"bench_{round_}_{replicas}"
                with psycopg.connect(base_url, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {database}")
                configs.append((label, base_url.rsplit("/", 1)[0] + "/" + database, replicas))
            for label, state, replicas in configs:
                results.setdefault(label, []).append(
                    run_config(label, state, replicas, args, Path(tmp) / f"round{round_}"))
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_ops")
        ops = {
            "sqlite": anyio.run(state_ops, str(Path(tmp) / "ops.db"), args.ops),
            "postgresql": anyio.run(state_ops, base_url.rsplit("/", 1)[0] + "/bench_ops", args.ops),
        }
    base = statistics.median(r[0] for r in results["no state"])
    print(f"{'configuration':<14} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9} {'added p50 ms':>13}")
    for label, rows in results.items():
        p50 = statistics.median(r[0] for r in rows)
        p99 = statistics.median(r[1] for r in rows)
        rate = statistics.median(r[2] for r in rows)
        print(f"{label:<14} {p50:8.2f} {p99:8.2f} {rate:9.0f} {p50 - base:13.2f}")
    print(f"({args.calls} calls, {args.inflight} in flight, median of {args.rounds} rounds; {os.cpu_count()} CPUs)")
    print(f"\n{'state operation (in process)':<28} {'sqlite us':>10} {'postgresql us':>14}")
    for name in ops["sqlite"]:
        print(f"{name:<28} {ops['sqlite'][name]:10.0f} {ops['postgresql'][name]:14.0f}")


if __name__ == "__main__":
    main()
