"""The MAD-service test modules on the umad transport: libibumad on kernel rxe in the lab.

One guest boot runs ``pytest -k umad`` on the shared MAD-service modules with
``IBAL_MAD_UMAD=1``, which adds the ``umad`` transport to their ``net``
fixture (tests/mad/mad_world.py): two clients of rxe0's QP1 through the
kernel's MAD layer.  This test asserts the run passed with the expected
counts and that each skip is one of the named umad ones.  Skips naming what
is missing without the lab or libibumad3 (``IBAL_LAB_REQUIRED=1`` fails
instead).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ibal.lab import Lab
from ibal.lab.host import PURPOSE_PYVERBS, PURPOSE_RUN
from ibal.lab.pytest_plugin import lab_requires

pytestmark = [pytest.mark.lab, pytest.mark.rdma_core, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LIBUMAD = Path("/usr/lib/x86_64-linux-gnu/libibumad.so.3")
MODULES = ["test_service.py", "test_service_wire.py", "test_service_rmpp.py"]
# test_service.py's 15 net cases and the flood; test_service_rmpp.py's 3 net cases (the
# kernel's RMPP: a request and a response in segments, the SA-style table and Set)
PASSED = 19
SKIPS = {  # module -> how many of its umad cases skip, and why (the reason's start)
    "test_service_wire.py": (1, "umad: the kernel's MAD layer checks and drops malformed"),
}


@pytest.mark.timeout(1500)
def test_the_mad_service_tests_pass_over_the_kernels_mad_layer(ibal_lab: Lab) -> None:
    lab_requires(PURPOSE_RUN, PURPOSE_PYVERBS)
    if not LIBUMAD.exists():
        if os.environ.get("IBAL_LAB_REQUIRED") == "1":
            pytest.fail("libibumad.so.3 missing (apt-get install libibumad3)")
        pytest.skip("libibumad.so.3 missing (apt-get install libibumad3)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["IBAL_MAD_UMAD"] = "1"
    here = Path(__file__).parent
    cmd = ["python3", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "umad",
           *(str(here / m) for m in MODULES)]  # fmt: skip
    result = ibal_lab.run(cmd, timeout=1400, env=env, cwd=str(REPO))
    out = result.stdout_text
    log = out + result.stderr_text[-4000:]
    assert result.returncode == 0, log
    skipped = sum(n for n, _ in SKIPS.values())
    # the summary line starts with "N failed" or "N error" when anything went wrong
    assert re.search(rf"^{PASSED} passed, {skipped} skipped, \d+ deselected in ", out, re.M), log
    skips = re.findall(r"^SKIPPED \[(\d+)\] \S*?(test_service\w*\.py):\d+: (.*)$", out, re.M)
    assert {m for _n, m, _why in skips} == set(SKIPS), log
    for module, (n, why) in SKIPS.items():
        mine = [(int(k), w) for k, m, w in skips if m == module]
        assert sum(k for k, _w in mine) == n and all(w.startswith(why) for _k, w in mine), mine
