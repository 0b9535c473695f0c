"""The ``drawbridge`` command line.

Adding a subcommand: create ``drawbridge/cli/<name>_cmd.py`` that defines a
``click`` command or group called ``command`` whose name is ``<name>`` with
underscores as hyphens (``approvals_cmd.py`` -> ``drawbridge approvals``,
``serve_http_cmd.py`` -> ``drawbridge serve-http``). ``main`` discovers such
modules by name and imports one only when its command runs (or when help lists
them), so a slow import (the gateway, uvicorn) never slows another command.
Nothing else needs editing. Shared output helpers and exit codes: ``output``.
"""
