"""Mutation testing of the sample provider and the mock's verbs with mutmut.

``python3 tests/conformance/mutation/run.py`` (what ``.ci/run`` calls) mutates the
functions ``mutmut_config.CI_SELECTION`` names (``--wide``: ``WIDE_SELECTION``), one
mutant at a time, and runs the
conformance suite against the provider owning the file (``pytest --ibal-provider
sample|mock -x``, the likeliest chapters first).  A mutant the suite does not
fail survives; every survivor must be listed in ``equivalent.EQUIVALENT`` with the
reason it cannot change behaviour, or the run exits 1.  It prints the kill rate
(the figure docs/conformance.md records).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

from equivalent import EQUIVALENT  # noqa: E402
from mutmut_config import CI_SELECTION, PROVIDER, WIDE_SELECTION, command  # noqa: E402

OFF = "string,fstring,decorator"
"""Mutation types left out: messages and decorators (a changed message is equivalent)."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # This tree's sample provider, whichever checkout an editable install points at.
    paths = (str(HERE), str(ROOT / "tests" / "sample_provider"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutant's bytecode must never be cached
    return env


def _mutmut(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, check=False)  # fmt: skip


def _diff(mutant_id: str) -> tuple[str, str, str]:
    """(file, original line, mutated line) of a mutant, stripped."""
    out = _mutmut("show", mutant_id).stdout
    path = re.search(r"^--- (\S+)", out, re.M)
    old = [line[1:].strip() for line in out.splitlines() if line.startswith("-") and
           not line.startswith("---")]  # fmt: skip
    new = [line[1:].strip() for line in out.splitlines() if line.startswith("+") and
           not line.startswith("+++")]  # fmt: skip
    return (path.group(1) if path else "?", " / ".join(old), " / ".join(new))


def _statuses() -> list[tuple[int, str]]:
    """(mutant id, mutmut status) of every mutant mutmut tested (skipped ones left out)."""
    with sqlite3.connect(ROOT / ".mutmut-cache") as db:
        rows = db.execute("SELECT id, status FROM Mutant ORDER BY id").fetchall()
    return [(int(i), str(st)) for i, st in rows if st not in ("skipped", "untested")]


def main() -> int:
    start = time.monotonic()
    selection = CI_SELECTION
    if "--wide" in sys.argv[1:]:
        os.environ["IBAL_MUTATION_WIDE"] = "1"  # read by mutmut_config in mutmut's process
        selection = WIDE_SELECTION
    (ROOT / ".mutmut-cache").unlink(missing_ok=True)
    for prefix, provider in PROVIDER.items():
        files = [f for f in selection if f.startswith(prefix)]
        if not files:
            continue
        for f in files:
            backup = ROOT / f"{f}.bak"
            if backup.exists():  # an interrupted mutmut run left its mutant in place
                backup.replace(ROOT / f)
            # stale bytecode of the original must not mask a mutant
            for pyc in (ROOT / f).parent.glob(f"__pycache__/{Path(f).stem}.*.pyc"):
                pyc.unlink()
        run = _mutmut("run", "--paths-to-mutate", ",".join(files), "--runner", command(provider),
                      "--disable-mutation-types", OFF, "--no-progress", "--CI")  # fmt: skip
        if run.returncode != 0:
            print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
            print(f"mutmut failed on {provider} (exit {run.returncode})")
            return 1
    killed = survived = timeouts = 0
    unexplained: list[str] = []
    equivalent: list[str] = []
    for mutant_id, status in _statuses():
        if status in ("ok_killed", "ok_suspicious"):
            killed += 1
        elif status == "bad_timeout":
            timeouts += 1  # the suite hung on it: detected
        elif status == "bad_survived":
            survived += 1
            key = _diff(str(mutant_id))
            line = f"{key[0]}: `{key[1]}` -> `{key[2]}`"
            if key in EQUIVALENT:
                equivalent.append(f"{line}  ({EQUIVALENT[key]})")
            else:
                unexplained.append(f"#{mutant_id} {line}")
    total = killed + survived + timeouts
    detected = killed + timeouts
    real = total - len(equivalent)
    print(f"mutants: {total} ({sum(len(v) for v in selection.values())} functions of "
          f"{len(selection)} files); killed {killed}, timed out {timeouts}, "
          f"survived {survived} ({len(equivalent)} equivalent)")  # fmt: skip
    rate = 100.0 * detected / real if real else 100.0
    print(f"kill rate: {detected} of {real} non-equivalent mutants ({rate:.1f} %), "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip
    for line in equivalent:
        print(f"  equivalent {line}")
    for line in unexplained:
        print(f"  SURVIVED {line}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
