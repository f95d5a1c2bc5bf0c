"""The Invalidate and MAD chapters against the mock provider with one mutant applied.

The counterpart of ``suite_broken.py`` for ``broken_mock.MOCK_MUTANTS``: the
mutants there break rules the sample provider does not implement.  Only the two
chapters they target run (the whole suite on the mock takes minutes).  Not
collected on its own (no ``test_`` prefix).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from broken_mock import MOCK_MUTANTS
from suite_broken import TIMEOUT, _shorten_waits

from ibal.ci import Provider
from ibal.providers.mock import MockProvider
from ibal.testing.suite import ch_mad
from ibal.testing.suite.ch_inv import InvalidateChecks
from ibal.testing.suite.ch_mad import MadChecks

MAD_WAIT = 3.0
"""Seconds a MAD check waits for a callback (the chapter's 20 s is sized for a real fabric;
the mock answers in milliseconds, and a kill by time-out should not cost 20 s)."""


class TestBrokenMock(MadChecks, InvalidateChecks):
    chapter = ""
    timeout = TIMEOUT

    @pytest.fixture
    def provider_factory(
        self, request: pytest.FixtureRequest, broken_mutant: str
    ) -> Callable[[], Provider]:
        mp = pytest.MonkeyPatch()
        request.addfinalizer(mp.undo)
        _shorten_waits(mp)
        mp.setattr(ch_mad, "WAIT", MAD_WAIT)
        if broken_mutant:
            MOCK_MUTANTS[broken_mutant].apply(mp)
        return lambda: MockProvider({})
