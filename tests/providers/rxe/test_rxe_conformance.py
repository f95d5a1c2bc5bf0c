"""The conformance suite on the rxe provider: two devices, 127.0.0.2 and 127.0.0.3,
in one process, talking through real sockets on the loopback interface."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from netns_util import need_root

from ibal.ci import Provider
from ibal.testing import ProviderConformance

DEVICES = "rxe_c0=127.0.0.2,rxe_c1=127.0.0.3"


class TestRxe(ProviderConformance):
    cross_ca = True  # known to share one, no probe (test_rxe_cross_ca.py tries the probe)
    device_required = True  # two loopback devices always open here (as root)

    @pytest.fixture
    def provider_factory(self) -> Callable[[], Provider]:
        # the rxe entry point may not be installed yet in an editable install: build directly
        from ibal.providers.rxe.provider import RxeProvider

        need_root()  # without raw sockets no device opens and the suite would only skip
        return lambda: RxeProvider({"devices": DEVICES})
