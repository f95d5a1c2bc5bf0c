"""The rdma_core provider against kernel rxe, in one lab guest boot.

One guest runs, back to back:

* ``guest_checks.py`` (this directory): the provider through the full access
  layer on ``rxe0``, on both data paths;
* the conformance suite: ``python -m pytest --ibal-provider rdma_core``.

The host-side tests below assert on the JUnit reports.  The conformance run
must have no failure (on ``lo``, other than :data:`KNOWN_RXE_ON_LO_DEVIATIONS`):
the kernel-rxe deviations are declared (reported as xfail)
(:data:`DECLARED_RXE_DEVIATIONS`, see docs/rdma-core-provider.md), and every
skip must come with a declared reason.

Skips, naming the missing Debian packages, without qemu, a kernel with
rdma_rxe, busybox-static or python3-pyverbs (``IBAL_LAB_REQUIRED=1`` turns the
skip into a failure, as in CI).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ibal.lab import Lab
from ibal.lab.host import PURPOSE_NET, PURPOSE_PYVERBS, PURPOSE_RUN
from ibal.lab.pytest_plugin import lab_report, lab_requires

pytestmark = [pytest.mark.lab, pytest.mark.rdma_core, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GUEST_CHECKS = Path(__file__).with_name("guest_checks.py")

DECLARED_RXE_DEVIATIONS: dict[str, str] = {
    # check -> the deviation the provider declares on rxe (caps.RXE_DEVIATIONS)
    "test_bad_lkey_is_local_protection_error": "precise_local_errors",
    "test_lkey_of_other_pd_is_local_protection_error": "precise_local_errors",
    "test_dereg_mr_with_posted_receive": "precise_local_errors",
    "test_receive_too_small_is_length_error": "precise_local_errors",
    "test_ud_receive_too_small_is_length_error": "precise_local_errors",
    "test_bound_window_refuses_outside_range": "mw_bounds_check",
    "test_type2_window_refuses_outside_range": "mw_bounds_check",
    "test_type2_bind_must_keep_the_index": "mw_bind_rkey_index",
    "test_send_with_invalidate_of_a_region_fails": "invalidate_nak",
    "test_bad_rkey_raises_wq_access_error_at_responder": "responder_events",
    "test_refused_request_raises_wq_error_at_responder": "responder_events",
    "test_first_receive_in_rtr_raises_comm_est": "comm_est",
    "test_qp_on_srq_in_error_raises_last_wqe_reached": "last_wqe_reached",
    "test_ud_send_error_enters_sqe_and_recovers_to_rts": "sqe",
}
"""Kernel rxe behaviour the provider declares (see docs/rdma-core-provider.md): those
checks run strictly and report an expected failure (xfail) naming the deviation."""

MUST_PASS_ON_RXE = (
    "test_request_and_response_between_two_agents_of_a_port",
    "test_qp1_drops_a_mad_with_the_wrong_qkey",
)
"""Checks that skip when the guest lacks a module (ib_umad): they must run and pass."""

KNOWN_RXE_ON_LO_DEVIATIONS: dict[str, str] = {}
"""Failures excused with rxe0 on ``lo``.  Kernel rxe on ``lo`` does not deliver IPv6
multicast datagrams; the suite sends to the IPv4-mapped group on a port addressed over
IPv4 (as rdma_cm does), which it delivers, so nothing is excused."""


@dataclass
class Report:
    """Outcomes of one JUnit report: test name -> (outcome, message)."""

    cases: dict[str, tuple[str, str]] = field(default_factory=dict)

    def names(self, outcome: str) -> list[str]:
        return sorted(n for n, (o, _) in self.cases.items() if o == outcome)

    def counts(self) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "skipped": 0}
        for o, _ in self.cases.values():
            out[o] += 1
        return out


def parse_junit(path: Path) -> Report:
    report = Report()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "skipped":
                outcome, message = "skipped", child.get("message", "")
        if name in report.cases and report.cases[name][0] == "failed":
            continue  # an error in teardown after a failure: keep the failure
        report.cases[name] = (outcome, message)
    return report


@dataclass
class GuestRun:
    returncode: int
    output: str
    guest: Report
    conformance: Report
    netdev: str


@pytest.fixture(scope="module")
def guest_run(ibal_lab: Lab) -> GuestRun:
    lab_requires(PURPOSE_RUN, PURPOSE_PYVERBS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    net = lab_report().ok_for(PURPOSE_NET)
    with ibal_lab.session(net=net) as s:
        g = s.guest_dir
        cmd = (
            f"python -m pytest -p no:cacheprovider -q {GUEST_CHECKS} --junitxml={g}/guest.xml; "
            # ib_umad gives the provider its MAD agents: without it the MAD chapter skips
            "modprobe ib_umad; python -m pytest --ibal-provider rdma_core -p no:cacheprovider -q "
            f"--junitxml={g}/conformance.xml"
        )
        result = s.run(["sh", "-c", cmd], timeout=1500, env=env, cwd=str(REPO))
        text = result.stdout_text + result.stderr_text
        reports = []
        for name in ("guest.xml", "conformance.xml"):
            path = s.host_dir / name
            if not path.exists():
                pytest.fail(f"the guest wrote no {name}:\n{text[-4000:]}", pytrace=False)
            reports.append(parse_junit(path))
    return GuestRun(result.returncode, text, reports[0], reports[1], "eth0" if net else "lo")


@pytest.mark.timeout(1800)
def test_provider_checks_pass_in_the_guest(guest_run: GuestRun) -> None:
    r = guest_run.guest
    counts = r.counts()
    assert counts["passed"] >= 20, counts  # both data paths ran
    assert r.names("failed") == [], {n: r.cases[n][1] for n in r.names("failed")}
    skipped = {n: r.cases[n][1] for n in r.names("skipped")}
    if guest_run.netdev == "lo":  # the only check that may skip, and only on lo
        skipped = {n: m for n, m in skipped.items() if "rxe on lo" not in m}
    assert skipped == {}, skipped


@pytest.mark.timeout(1800)
def test_conformance_suite_on_kernel_rxe(
    guest_run: GuestRun, record_property: Callable[[str, object], None]
) -> None:
    r = guest_run.conformance
    counts = r.counts()
    record_property("conformance", counts)
    print(f"conformance on kernel rxe ({guest_run.netdev}): {counts}; failing: "
          f"{sorted(n for n in r.names('failed'))}")  # fmt: skip
    assert counts["passed"] > 100, (counts, guest_run.output[-4000:])
    failed = r.names("failed")
    known = dict(KNOWN_RXE_ON_LO_DEVIATIONS) if guest_run.netdev == "lo" else {}
    unexpected = {n: r.cases[n][1] for n in failed if n.split("[")[0] not in known}
    assert unexpected == {}, unexpected
    for check, capability in DECLARED_RXE_DEVIATIONS.items():
        outcomes = {n: r.cases[n] for n in r.cases if n.split("[")[0] == check}
        assert outcomes, f"{check} did not run"
        for name, (outcome, message) in outcomes.items():
            if outcome == "skipped":  # an xfail in JUnit: the declared deviation, reported
                assert f"deviation {capability}: kernel rxe" in message, (name, message)
    for check in MUST_PASS_ON_RXE:
        outcomes = {n: r.cases[n] for n in r.cases if n.split("[")[0] == check}
        assert outcomes and all(o == "passed" for o, _ in outcomes.values()), (check, outcomes)
    for name in r.names("skipped"):
        message = r.cases[name][1]
        assert message, f"{name} skipped without a reason"
        assert "does not declare" not in message, f"{name}: {message}"
