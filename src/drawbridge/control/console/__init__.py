"""The web console: the control plane's routes as pages a person reads and acts on, at ``/console/``.

It is served on the control plane's own listener, behind the same admin credential (presented once,
at login, then a session cookie and a CSRF token per form; ``sessions``), and it changes nothing
except through the control plane's own handlers (``actions``), so what it shows (``pages``) is what
the gateway decides. ``app.console_mount`` is what the gateway mounts; docs/console.md describes it.
"""

from drawbridge.control.console.app import Console, console_mount

__all__ = ["Console", "console_mount"]
