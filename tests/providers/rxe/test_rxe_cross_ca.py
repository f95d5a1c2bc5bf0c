"""RoCE devices get the cross-CA checks: the suite finds out by trying that two rxe devices
reach each other, and ``--ibal-cross-ca`` forces either answer."""

from __future__ import annotations

from netns_util import need_root

from ibal.testing.runner import RunResult, run_conformance

DEVICES = {"devices": "rxe_f0=127.0.0.92,rxe_f1=127.0.0.93"}
CHECKS = "test_rc_send_lands or test_rc_rdma_read_fetches"


def _run(*extra: str) -> RunResult:
    need_root()
    return run_conformance("rxe", DEVICES, extra_args=["-q", "-p", "no:cacheprovider",
                                                       "-k", CHECKS, *extra])  # fmt: skip


def test_two_roce_devices_that_reach_each_other_run_the_cross_ca_variant() -> None:
    result = _run()
    assert (result.failed, result.errors, result.skipped) == (0, 0, 0), result.problems()
    two = [c for c in result.checks if "two_cas" in c.nodeid]
    assert len(two) == 2 and {c.outcome for c in two} == {"passed"}


def test_cross_ca_no_skips_naming_the_option() -> None:
    result = _run("--ibal-cross-ca=no")
    skipped = [c for c in result.checks if c.outcome == "skipped"]
    assert [c.nodeid.split("[")[-1] for c in skipped] == ["two_cas]", "two_cas]"]
    assert {c.message for c in skipped} == {
        "cross-CA variant: the CAs are declared apart (--ibal-cross-ca=no)"
    }
    assert result.passed == 2
