"""pytest fixtures for tests that need a real kernel RDMA stack (rdma_rxe in a VM).

Load with `-p ibal.lab.pytest_plugin` (or `pytest_plugins = [...]` in a root
conftest). Fixtures:

* `ibal_lab` (session): a prepared `Lab`; `ibal_lab.run(cmd)` boots a fresh
  guest per call. Skips, naming the missing Debian packages, when the host
  cannot run the lab.
* `ibal_lab_session` (function): one booted guest (rxe0 on lo) for the test;
  run several commands in it with `.run()` / `.guest_start()`.
* `ibal_lab_net` (function): a booted guest whose rxe0 sits on eth0, linked to
  a tap in a fresh network namespace; host-side peers run there through
  `.host_popen()`, `.host_run()` or `with .in_netns():`.
* `ibal_lab_module_session`, `ibal_lab_module_net`: the same two guests, but
  one boot shared by the tests of a module (a boot costs 10-30 s under TCG).
  Only for tests that leave the guest as they found it (no module loaded,
  no qdisc, MTU or address changed, no job left running); each test first
  checks the guest is still up, so a crash fails the next test by name.

A function-scoped guest is powered off and its namespace deleted when its
test ends, so those tests never share guest state. `lab_requires("pyverbs")` skips a test
that needs an optional piece. With IBAL_LAB_REQUIRED=1 (set it in CI) a
missing piece fails the test instead of skipping it; IBAL_LAB=0 skips all.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import pytest

from ibal.lab.host import PURPOSE_NET, PURPOSE_RUN, CheckReport, LabUnavailable, check
from ibal.lab.vm import Lab, LabSession

MARKER = "lab: needs the ibal lab (qemu guest with kernel rdma_rxe); see docs/lab.md"


def pytest_configure(config: pytest.Config) -> None:
    """Register the `lab` marker, so strict-markers runs accept it."""
    config.addinivalue_line("markers", MARKER)


@functools.lru_cache(maxsize=1)
def lab_report() -> CheckReport:
    """The host's `check()` report, computed once per process."""
    return check()


def _unavailable(reason: str) -> None:
    """Skip (or fail, in CI with IBAL_LAB_REQUIRED=1) with `reason`."""
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{reason} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(reason)


def lab_requires(*purposes: str) -> None:
    """Skip the calling test unless the pieces for `purposes` are present.

    Purposes: "run", "net", "pyverbs", "capture" (tshark), "perftest", "rdmacm". The
    reason names each missing piece and the Debian package providing it.
    """
    if os.environ.get("IBAL_LAB", "") == "0":
        pytest.skip("ibal lab disabled by IBAL_LAB=0")
    reason = lab_report().skip_reason(*purposes)
    if reason:
        _unavailable(reason)


@pytest.fixture(scope="session")
def ibal_lab() -> Lab:
    """A prepared Lab (kernel found, initramfs cached); skips when unavailable."""
    lab_requires(PURPOSE_RUN)
    lab = Lab()
    try:
        lab.prepare()
    except LabUnavailable as exc:
        _unavailable(f"ibal lab unavailable: {exc}")
    return lab


@pytest.fixture
def ibal_lab_session(ibal_lab: Lab) -> Iterator[LabSession]:
    """A guest booted for this test alone, rxe0 on lo."""
    with ibal_lab.session() as session:
        yield session


@pytest.fixture
def ibal_lab_net(ibal_lab: Lab) -> Iterator[LabSession]:
    """A guest booted for this test alone, rxe0 on eth0, linked to a tap in a new namespace."""
    lab_requires(PURPOSE_NET)
    with ibal_lab.session(net=True) as session:
        yield session


def _alive(session: LabSession, fixture: str) -> LabSession:
    """`session`, after checking an earlier test of the module did not end it."""
    if not session.alive:
        pytest.fail(
            f"{fixture}: the module's shared guest is gone (an earlier test ended it)\n"
            f"{session.console_tail()}",
            pytrace=False,
        )
    return session


@pytest.fixture(scope="module")
def ibal_lab_module_guest(ibal_lab: Lab) -> Iterator[LabSession]:
    """The guest behind `ibal_lab_module_session` (use that: it checks the guest is up)."""
    with ibal_lab.session() as session:
        yield session


@pytest.fixture(scope="module")
def ibal_lab_module_net_guest(ibal_lab: Lab) -> Iterator[LabSession]:
    """The guest behind `ibal_lab_module_net` (use that: it checks the guest is up)."""
    lab_requires(PURPOSE_NET)
    with ibal_lab.session(net=True) as session:
        yield session


@pytest.fixture
def ibal_lab_module_session(ibal_lab_module_guest: LabSession) -> LabSession:
    """A guest (rxe0 on lo) booted once for the module's tests, checked alive for each."""
    return _alive(ibal_lab_module_guest, "ibal_lab_module_session")


@pytest.fixture
def ibal_lab_module_net(ibal_lab_module_net_guest: LabSession) -> LabSession:
    """A guest with rxe0 on eth0 and its namespace, booted once for the module's tests."""
    return _alive(ibal_lab_module_net_guest, "ibal_lab_module_net")

