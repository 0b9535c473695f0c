"""The earlier anyio JSON-lines client of bench/overhead.py (``--client anyio``): sequential and
in-flight figures through an event-loop client, which hides part of the server's work behind its own."""

from __future__ import annotations

import json
import time

import anyio
from anyio.abc import Process

from raw_client import cpu_seconds


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


async def _session(argv: list[str], env: dict[str, str], calls: int, inflight: int, warm_up: int) -> tuple[list[float], float, float]:
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

        for i in range(warm_up):
            await pipe.send(call(i))
            await pipe.line()
        cpu_before = cpu_seconds(process.pid)
        latencies = []
        for i in range(calls):
            start = time.perf_counter()
            await pipe.send(call(i))
            answer = await pipe.line()
            latencies.append((time.perf_counter() - start) * 1000)
            assert "result" in answer and not answer["result"].get("isError"), answer
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
        cpu_per_call = (cpu_seconds(process.pid) - cpu_before) / (2 * calls)
        assert process.stdin is not None
        await process.stdin.aclose()
    return latencies, rate, cpu_per_call


def session(argv: list[str], env: dict[str, str], calls: int, inflight: int, warm_up: int) -> tuple[list[float], float, float]:
    return anyio.run(_session, argv, env, calls, inflight, warm_up)
