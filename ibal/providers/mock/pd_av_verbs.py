"""Protection domains and address vectors.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.ci.interface import (
    Handle,
)
from ibal.providers.mock.objects import (
    MockAv,
    MockPd,
)
from ibal.status import (
    InvalidParameter,
)
from ibal.types import (
    AvAttr,
    PdType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    CaState,
    verb,
)


class PdAvVerbs(CaState):
    """Protection domains and address vectors."""

    @verb
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        self._h_ca(h_ca)
        try:
            kind = PdType(pd_type)
        except ValueError:
            raise InvalidParameter(f"unknown PD type {pd_type!r}") from None
        self._check_count("pd", self.limits.max_pds)
        self._adopt("pd")
        return MockPd(self, kind)

    @verb
    def deallocate_pd(self, h_pd: Handle) -> None:
        pd = self._h_pd(h_pd)
        self._release_pd(pd)

    @verb
    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        pd = self._h_pd(h_pd)
        self._check_av(attr)
        self._check_count("av", self.limits.max_avs)
        self._adopt("av", pd)
        return MockAv(self, pd, attr)

    @verb
    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        av = self._h_av(h_av)
        self._check_av(attr)
        av.attr = attr

    @verb
    def destroy_av(self, h_av: Handle) -> None:
        av = self._h_av(h_av)
        self._retire("av", av, av.pd)
