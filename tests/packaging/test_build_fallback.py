"""Installing without a C compiler: ibal installs as pure Python and says so once.

A copy of the tree (no compiled module in it) goes into a fresh venv with
``CC=/bin/false``; the venv borrows this interpreter's site-packages for
setuptools and cffi at run time; pip fetches the build requirements as usual.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_without_a_compiler_ibal_installs_and_runs_as_pure_python(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("needs git (Debian package git) to copy the tracked tree")
    pytest.importorskip("cffi")
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        rel = f.decode()
        if not (ROOT / rel).is_file():
            continue  # deleted in the work tree, not yet committed
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True
    )
    py = venv / "bin" / "python"
    env = dict(os.environ, CC="/bin/false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("IBAL_RXE_ENGINE", None)
    inst = subprocess.run(
        [str(py), "-m", "pip", "install", "-v", "--no-deps", "-e", str(src)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert inst.returncode == 0, inst.stdout + inst.stderr
    said = inst.stdout + inst.stderr
    assert said.count("compiled rxe engine was not built") == 1, said
    assert not list(src.glob("ibal/providers/rxe/_fastpath*.so"))
    probe = (
        "import ibal, ibal.providers.rxe.fastpath as f; "
        "print(ibal.__file__); print(f.choose()); print(f.choose())"
    )
    run = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    where, first, second = run.stdout.split()
    assert where.startswith(str(src))
    assert (first, second) == ("python", "python")
    assert run.stderr.count("RuntimeWarning") == 1
    assert "pure Python" in run.stderr
    refused = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env=dict(env, IBAL_RXE_ENGINE="c"),
    )  # fmt: skip
    assert refused.returncode != 0
    assert "IB_UNSUPPORTED" in refused.stderr and "not built" in refused.stderr
