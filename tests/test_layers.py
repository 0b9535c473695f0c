"""The layers of docs/architecture.md hold: ``lint-imports`` keeps every contract of pyproject.toml, the
contracts name every package (a new one cannot escape them), they catch a real violation, and no
module outgrows the size the architecture allows."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT, scaled

SRC = ROOT / "src" / "drawbridge"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
NOT_LAYERED = {"drawbridge.__main__", "drawbridge.examples", "drawbridge.gateway"}
"""The entry point, the example servers (apart: nothing imports them) and the shell's package face."""


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def _lint(root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=scaled(120),
    )


def test_every_import_contract_is_kept() -> None:
    done = _lint(ROOT / "src", ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = done.stdout.count(" KEPT")
    assert kept == len(_contracts()) == 3, done.stdout


def test_the_layers_name_every_package_of_the_project() -> None:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    named = {name.strip() for layer in layers["layers"] for name in str(layer).split("|")}  # type: ignore[union-attr]
    packages = {f"drawbridge.{path.stem if path.suffix else path.name}" for path in SRC.iterdir()
                if (path.is_dir() and (path / "__init__.py").exists()) or (path.suffix == ".py" and path.stem != "__init__")}
    gateway = {f"drawbridge.gateway.{path.stem if path.suffix else path.name}" for path in (SRC / "gateway").iterdir()
               if (path.is_dir() and (path / "__init__.py").exists()) or (path.suffix == ".py" and path.stem != "__init__")}
    assert (packages | gateway) - NOT_LAYERED == named


def test_a_core_module_that_imports_the_shell_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "drawbridge", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "drawbridge" / "policy" / "evaluate.py"
    target.write_text(target.read_text(encoding="utf-8") + "\nimport drawbridge.state.sqlite  # noqa\n", encoding="utf-8")
    done = _lint(copy, tmp_path)
    assert done.returncode != 0
    assert "drawbridge.policy.evaluate -> drawbridge.state.sqlite" in done.stdout
    # The layers, the pure core, and the acyclic packages (state already imports policy): all three.
    assert done.stdout.count(" BROKEN") == 3
    assert "- .policy -> .state (1 import)" in done.stdout


def _sizes() -> dict[str, int]:
    return {str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
            for path in SRC.rglob("*.py")}


def test_no_module_outgrows_its_concept() -> None:
    sizes = _sizes()
    assert max(sizes.values()) <= 800, sorted(sizes.items(), key=lambda item: -item[1])[:3]
    large = {name: lines for name, lines in sizes.items() if lines > 500}
    assert len(large) <= 5, large
    for name in large:
        docstring = ast.get_docstring(ast.parse((SRC / name).read_text(encoding="utf-8"))) or ""
        assert "Size." in docstring, f"{name} ({large[name]} lines) says in a 'Size.' paragraph why it is one module"
