"""The control plane's shadow route: ``GET /shadow``, what the shadow policy would have decided.

Invariant: the answer is the gateway's tally of the recorded calls (``ControlServices.shadow``): the
shadow set's files and digest, totals, and counts per agent, tool and pair of actions, never an
argument; without a shadow policy it is a 404 that says so. Nothing here changes the shadow set: it is
edited only in its files (``policy set`` and the console edit the enforced set).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from drawbridge.control.problems import Problem
from drawbridge.control.services import ControlServices

NO_SHADOW = "no shadow policy is configured"


class ShadowHandlers:
    services: ControlServices

    async def shadow(self, request: Request) -> Response:
        report = self.services.shadow() if self.services.shadow is not None else None
        if report is None:
            raise Problem(404, NO_SHADOW)
        return JSONResponse(report)


__all__ = ["NO_SHADOW", "ShadowHandlers"]
