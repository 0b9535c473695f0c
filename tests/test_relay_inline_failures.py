"""The relay's failure tests again, with the decider and recorder in synchronous form (inline calls).

``drawbridge wrap`` with a policy and the evidence recorder handles each tools/call without a task
(see ``stdio_relay``); the scripted harness normally exercises the call-task route. This module
re-runs the same tests against ``relay_harness_inline.py``, which offers the harness's hooks as
``decide_now``/``record_now``, so every answer, error, incident and record must come out the same
on both routes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_relay_failures as failures
from conftest import FIXTURES, Harness

INLINE_HARNESS = FIXTURES / "relay_harness_inline.py"


class InlineHarness(Harness):
    def argv(self) -> list[str]:
        argv = super().argv()
        assert argv[1].endswith("relay_harness.py")
        argv[1] = str(INLINE_HARNESS)
        return argv


@pytest.fixture
def harness(tmp_path: Path):
    def make(server: Any, **options: Any) -> Harness:
        return InlineHarness(records_path=tmp_path / "records.jsonl", server=server, **options)

    return make


pytestmark = pytest.mark.anyio

for _name in dir(failures):
    if _name.startswith("test_"):
        globals()[_name] = getattr(failures, _name)
del _name
