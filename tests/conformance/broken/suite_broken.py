"""The conformance suite against the sample provider with one mutant applied.

Run by ``test_mutants.py`` through :func:`ibal.testing.runner.run_pytest` with
a plugin that provides the ``broken_mutant`` fixture (the name of a mutant or of
a conformant variant; ``""`` for the sample as shipped).  Not collected on its
own (no ``test_`` prefix).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from broken_sample import DEVIATING, MUTANTS, VARIANTS
from ibal_sample_provider import SampleProvider

from ibal.ci import Provider
from ibal.testing import ProviderConformance, helpers

TIMEOUT = 1.0
"""Seconds a check waits here: the sample completes everything inside the verb that
posts it, so a wait that lasts longer has failed already (the suite's default is
sized for real hardware and would make every kill by timeout cost 10 s)."""


def _shorten_waits(mp: pytest.MonkeyPatch) -> None:
    """Give every waiting helper the short default ``TIMEOUT``."""
    holders = [helpers, *(c for _, c in inspect.getmembers(helpers, inspect.isclass))]
    for holder in holders:
        for name, fn in vars(holder).items():
            defaults = getattr(fn, "__defaults__", None)
            if defaults and helpers.DEFAULT_TIMEOUT in defaults and not name.startswith("__"):
                short = tuple(TIMEOUT if d == helpers.DEFAULT_TIMEOUT else d for d in defaults)
                mp.setattr(fn, "__defaults__", short)


class TestBrokenSample(ProviderConformance):
    timeout = TIMEOUT

    @pytest.fixture
    def provider_factory(
        self, request: pytest.FixtureRequest, broken_mutant: str
    ) -> Callable[[], Provider]:
        mp = pytest.MonkeyPatch()
        request.addfinalizer(mp.undo)
        _shorten_waits(mp)
        if broken_mutant in VARIANTS:
            VARIANTS[broken_mutant](mp)
        elif broken_mutant in DEVIATING:
            DEVIATING[broken_mutant](mp)
        elif broken_mutant:
            MUTANTS[broken_mutant].apply(mp)
        return lambda: SampleProvider({})
