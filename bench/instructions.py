"""Instructions the gateway process executes per tools/call, counted by valgrind's callgrind.

Wall-clock figures on a shared or virtual machine move by ten per cent from one round to the next;
an instruction count does not (the same binary, inputs and environment give the same count, whatever
else the machine does). This runs ``drawbridge wrap`` in front of bench/echo_server.py under
``valgrind --tool=callgrind`` twice, with a few and with many calls (the workload of
bench/overhead.py: sequential calls, then calls with 32 in flight), and prints the difference per
call, so the start-up is left out; and the start-up itself (everything but the calls: imports,
the policy, the evidence files, the child, the handshake). ``--compare DIR`` counts another source tree (its ``src`` folder) the same way.

    python bench/instructions.py [--configs evidence,evidence+carriers] [--compare DIR]

Needs valgrind (Debian: ``apt-get install valgrind``). Each count takes a minute or two.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402 -- the same workload, from the script beside this one

FEW, MANY = 300, 1300


async def _instructions(tree: Path | None, config: str, calls: int) -> int:
    env = dict(os.environ)
    env["DRAWBRIDGE_TDT_HMAC_KEY"] = "bench-key-0123456789abcdef-0123456789"
    env["DRAWBRIDGE_TDT_HMAC_KEY_ID"] = "bench-kid"
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = overhead._gateway(Path(tmp), config, "batch", overhead.SERVERS["raw"])
        argv = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no", *argv]
        await overhead._session(argv, env, calls, 32)
        with anyio.fail_after(120):
            while True:  # valgrind writes its counts as the process exits
                text = out.read_text(errors="replace") if out.exists() else ""
                found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
                if found:
                    return int(found.group(1))
                await anyio.sleep(0.2)


async def main_async(args: argparse.Namespace) -> None:
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.compare:
        trees.append(("compared", Path(args.compare).resolve()))
    print(f"drawbridge wrap in front of a raw echo, under callgrind; per call: ({MANY} - {FEW}) calls, "
          "each sequentially and with 32 in flight")
    print(f"{'':<32}{'instructions/call':>20}{'start-up':>16}")
    for config in args.configs.split(","):
        for label, tree in trees:
            few = await _instructions(tree, config, FEW)
            many = await _instructions(tree, config, MANY)
            per_call = (many - few) / (2 * (MANY - FEW))
            startup = few - per_call * (overhead.WARM_UP + 2 * FEW)
            print(f"{config + ' (' + label + ')':<32}{per_call:>20,.0f}{startup:>16,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="evidence,evidence+carriers")
    parser.add_argument("--compare", metavar="DIR", help="also count the gateway of this source tree (its src)")
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
