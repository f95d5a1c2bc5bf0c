"""The layers as an executable contract: import-linter's contracts of pyproject.toml hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter (PyPI) is not installed")
    out = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
         "lint_imports_command()", "--no-cache"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_a_layer_importing_upwards_breaks_the_contract(tmp_path: Path) -> None:
    """The contract is not vacuous: a copy of the tree where the access layer
    imports the CM (the kind of import compat.py once made) fails it."""
    pytest.importorskip("importlinter", reason="import-linter (PyPI) is not installed")
    import shutil

    shutil.copytree(ROOT / "ibal", tmp_path / "ibal", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "ibal" / "al" / "upwards.py"
    bad.write_text("def f() -> None:\n    from ibal.cm import api  # noqa: F401\n")
    out = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
         "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--no-cache"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0
    assert "ibal.al.upwards -> ibal.cm.api" in out.stdout
