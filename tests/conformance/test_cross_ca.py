"""How the suite decides whether two CAs share a fabric, and what it says when they do not."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv6Address

from ibal import open_al
from ibal.testing.fabric import by_attributes
from ibal.testing.helpers import active_port
from ibal.testing.runner import run_conformance


def test_infiniband_ports_by_their_attributes() -> None:
    with open_al(providers={"mock": {"cas": 2}}) as al:
        a, b = (active_port(al.open_ca(g).query().ports) for g in al.get_ca_guids()[:2])
        assert a is not None and b is not None
        assert by_attributes(a, b).same
        other_prefix = replace(b, gids=(IPv6Address("fe81::1"),))
        verdict = by_attributes(a, other_prefix)
        assert not verdict.same and "different subnet prefixes" in verdict.how
        same_lid = replace(b, lid=a.lid)
        assert not by_attributes(a, same_lid).same


def test_one_ca_says_so_and_yes_cannot_invent_a_second() -> None:
    for extra in ([], ["--ibal-cross-ca=yes"]):
        result = run_conformance("mock", {"cas": 1}, extra_args=["-q", "-p", "no:cacheprovider",
                                 "-k", "test_rc_send_lands", *extra])  # fmt: skip
        (skip,) = [c for c in result.checks if c.outcome == "skipped"]
        assert skip.message == "cross-CA variant: the provider offers one CA"


def test_two_mock_cas_run_the_cross_ca_variant_unless_told_no() -> None:
    args = ["-q", "-p", "no:cacheprovider", "-k", "test_rc_send_lands"]
    assert run_conformance("mock", {"cas": 2}, extra_args=args).passed == 2
    result = run_conformance("mock", {"cas": 2}, extra_args=[*args, "--ibal-cross-ca=no"])
    assert (result.passed, result.skipped) == (1, 1)
