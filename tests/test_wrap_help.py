"""wrap's ``--help`` and the README's wrap table say the same: every option is in the table, and the
help of the options the README explains further does not say less (a new user reads one or the other).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import PYTHON, child_env, scaled

README = Path(__file__).resolve().parent.parent / "README.md"


def _wrap_help() -> str:
    done = subprocess.run([PYTHON, "-m", "drawbridge", "wrap", "--help"], capture_output=True, text=True,
                          env={**child_env(), "COLUMNS": "400"}, timeout=scaled(60), check=False)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_every_wrap_option_is_in_the_readmes_wrap_table() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Put it in front of an MCP server: `drawbridge wrap`"):]
    section = section[: section.index("\n## ", 1)]
    listed = _wrap_help().split("Options:", 1)[1]
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+|-[a-z])\b", listed)) - {"-h", "--help"}
    missing = sorted(option for option in options if f"`{option}" not in section)
    assert missing == [], f"wrap options the README's wrap section does not name: {missing}"


def test_the_help_says_what_the_readme_says_of_state_and_the_control_port() -> None:
    shown = _wrap_help()
    state = shown[shown.index("--state FILE"):]
    assert "else a private temporary file removed at exit" in state[:300]
    port = shown[shown.index("--control-port"):]
    assert "approvals, grants, the server's tools and their decisions" in port[:300]
