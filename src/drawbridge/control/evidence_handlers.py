"""The control plane's evidence route: ``GET /evidence/checkpoint``, the trace's latest signed checkpoint.

Invariant: what is served is a C2SP signed note the gateway's checkpoint key signed over every trace
line written when it was asked (a new checkpoint is signed when lines wait for one), as text; it names
no private key and no record. Polling it and keeping the answers elsewhere is how a copy comes to
exist that the operator cannot rewrite (``drawbridge evidence verify-chain --known-checkpoint``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from drawbridge.control.problems import Problem
from drawbridge.control.services import ControlServices


class EvidenceHandlers:
    services: ControlServices

    async def checkpoint(self, request: Request) -> Response:
        provider = self.services.checkpoint
        note = await provider() if provider is not None else None
        if note is None:
            raise Problem(404, "this gateway signs no checkpoints: it writes no trace (no evidence directory)")
        return PlainTextResponse(note, media_type="text/plain; charset=utf-8")


__all__ = ["EvidenceHandlers"]
