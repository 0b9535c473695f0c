"""The control plane: HTTP routes an operator (or the console, or the ``drawbridge`` CLI) uses to see
and change what the gateway decides.

``auth`` holds the access rule (admin token, else loopback only); ``services`` the value the gateway
fills in (``ControlServices``); ``routes`` the route table (``control_routes`` to mount beside
``/mcp``, ``control_app`` for an app of their own) over the handlers of ``catalogue_handlers`` and
``approval_handlers``, which read requests through ``inputs``, refuse through ``problems`` and show
through ``views``. Every route and status code is in docs/control-plane.md.
"""

from drawbridge.control.auth import ADMIN_REQUIRED, AdminAuth, Refusal
from drawbridge.control.problems import Problem
from drawbridge.control.routes import ControlPlane, control_app, control_routes
from drawbridge.control.services import (
    PIN_ACCEPT_KIND,
    CatalogueItem,
    CatalogueProvider,
    ControlServices,
    HeldBackTool,
    PinService,
    RecentCallRing,
    RecentCalls,
    StorePinService,
    TraceAppend,
    agent_visible_name,
    current_catalogue,
)
from drawbridge.control.views import policy_view, tool_view

__all__ = [
    "ADMIN_REQUIRED",
    "PIN_ACCEPT_KIND",
    "AdminAuth",
    "CatalogueItem",
    "CatalogueProvider",
    "ControlPlane",
    "ControlServices",
    "HeldBackTool",
    "PinService",
    "Problem",
    "RecentCallRing",
    "RecentCalls",
    "Refusal",
    "StorePinService",
    "TraceAppend",
    "agent_visible_name",
    "control_app",
    "control_routes",
    "current_catalogue",
    "policy_view",
    "tool_view",
]
