"""An editable install of ibal is visible to static type checkers."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_finds_an_editable_ibal_from_another_directory(tmp_path: Path) -> None:
    """``pip install -e`` must write a path .pth, not an import-hook finder mypy cannot follow."""
    pytest.importorskip("mypy")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    pths = [p.read_text().strip() for p in site.glob("__editable__*ibal*.pth")]
    assert pths == [str(ROOT)]
    assert not list(site.glob("__editable__*ibal*finder.py"))
    sample = ROOT / "tests" / "sample_provider" / "ibal_sample_provider"
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(python), str(sample)],
        capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env,
    )
    assert mypy.returncode == 0, mypy.stdout[-3000:]
