"""bench/overhead.py's http mode: ``drawbridge serve`` over streamable HTTP against server-everything's
own HTTP transport, in one run (configurations interleaved, several rounds, medians).

``serve`` has server-everything over stdio behind it, an allow-all policy and evidence on (its
defaults); ``everything-http`` is server-everything started with ``streamableHttp``. Both are driven
by the same raw HTTP client (bench/http_client.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from http_client import HttpSession, concurrent_rate
from raw_client import cpu_seconds, rss_kib, tree_env

CONFIGS = ("everything-http", "serve")
COMPARED = " (compared)"
URL_LINE = re.compile(rb"serving \d+ upstream\(s\) on (http://\S+/mcp)")
START_SECONDS = 60.0
WARM_UP = 100
TOKEN = "bench-token-0123456789"
"""The agent's bearer token for serve (the file holds its SHA-256 only)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_everything(node_bin: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen([str(node_bin / "mcp-server-everything"), "streamableHttp"], env={**env, "PORT": str(port)},
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.005)
    process.kill()
    raise RuntimeError("server-everything did not listen")


def _start_serve(tmp: Path, node_bin: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "policies").mkdir()
    (tmp / "policies" / "allow.yaml").write_text("name: allow\nagent: '*'\nrules:\n  - tools: ['*']\n    action: allow\n")
    config = {"upstreams": [{"name": "everything", "transport": "stdio",
                             "command": str(node_bin / "mcp-server-everything"), "args": ["stdio"]}],
              "policy_dir": "./policies", "listen": {"port": 0}, "control": {"port": 0},
              "auth": {"agents": [{"agent": "bench", "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]}}
    (tmp / "drawbridge.yaml").write_text(json.dumps(config))
    process = subprocess.Popen([sys.executable, "-m", "drawbridge", "serve", "--config", str(tmp / "drawbridge.yaml")],
                               env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            match = URL_LINE.search(line)
            if match and not found:
                found.append(match.group(1).decode())
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(START_SECONDS)
    if not found:
        process.kill()
        raise RuntimeError("serve did not start")
    return process, found[0]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_http(args: argparse.Namespace, env: dict[str, str], node_bin: Path,
             pct: Callable[[list[float], float], float], median: Callable[[list[float]], float]) -> None:
    configs = list(CONFIGS)
    if args.compare:
        configs.append(f"serve{COMPARED}")
    calls = args.http_calls
    latencies: dict[str, list[float]] = {c: [] for c in configs}
    rates: dict[str, list[float]] = {c: [] for c in configs}
    spawn: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    rss: dict[str, list[float]] = {c: [] for c in configs}
    for round_index in range(args.rounds):
        for config in configs:
            with tempfile.TemporaryDirectory() as tmp:
                run_env = tree_env(env, args.compare if config.endswith(COMPARED) else None)
                started = time.perf_counter()
                if config == "everything-http":
                    process, url = _start_everything(node_bin, run_env)
                    tool, headers = "echo", {}
                else:
                    process, url = _start_serve(Path(tmp), node_bin, run_env)
                    tool, headers = "everything.echo", {"authorization": f"Bearer {TOKEN}"}
                try:
                    session = HttpSession(url, tool, headers)
                    session.initialize()
                    spawn[config].append(time.perf_counter() - started)
                    for _ in range(WARM_UP):
                        session.call()
                    cpu_before = cpu_seconds(process.pid)
                    latencies[config].extend(session.call() for _ in range(calls))
                    session.close()
                    rates[config].append(concurrent_rate(url, tool, args.sessions, calls, headers))
                    cpu[config].append((cpu_seconds(process.pid) - cpu_before) / (2 * calls))
                    if round_index == args.rounds - 1:
                        done = WARM_UP + 2 * calls
                        if args.rss_calls > done:
                            concurrent_rate(url, tool, args.sessions, args.rss_calls - done, headers)
                        rss[config].append(rss_kib(process.pid) / 1024)
                finally:
                    _stop(process)
    print(f"http: tools/call echo over streamable HTTP; per configuration and round {calls} sequential calls on "
          f"one kept-alive session and {calls} over {args.sessions} sessions at once; {args.rounds} rounds")
    if args.compare:
        print(f"compared tree: {Path(args.compare).resolve()}")
    base50, base_rate = pct(latencies["everything-http"], 0.5), median(rates["everything-http"])
    print(f"{'':<22}{'p50 ms':>9}{'p99 ms':>9}{'/own':>7}{'calls/s':>10}{'/own':>7}{'CPU us':>9}{'RSS MiB':>9}{'spawn s':>9}")
    for config in configs:
        p50, rate = pct(latencies[config], 0.5), median(rates[config])
        print(f"{config:<22}{p50:>9.3f}{pct(latencies[config], 0.99):>9.3f}{p50 / base50:>7.2f}{rate:>10.0f}"
              f"{rate / base_rate:>7.2f}{median(cpu[config]) * 1e6:>9.0f}{median(rss[config]):>9.1f}"
              f"{median(spawn[config]):>9.3f}")
    print(f"(/own: p50 and calls/s as ratios of server-everything's own HTTP mode; CPU: the process's own time per "
          f"call (serve: without its child); RSS after {max(args.rss_calls, WARM_UP + 2 * calls)} calls (last round); "
          f"spawn: to the initialize answer. calls/s per round: "
          + "; ".join(f"{c} " + ", ".join(f"{r:.0f}" for r in rates[c]) for c in configs) + ")")
