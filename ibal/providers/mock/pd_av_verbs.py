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
    ResourceBusy,
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
        self._n["pd"] += 1
        return MockPd(self, kind)

    @verb
    def deallocate_pd(self, h_pd: Handle) -> None:
        pd = self._h_pd(h_pd)
        if pd.users:
            raise ResourceBusy(f"PD still used by {pd.users} QP/SRQ/AV/MR/MW")
        pd.alive = False
        self._n["pd"] -= 1

    @verb
    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        pd = self._h_pd(h_pd)
        self._check_av(attr)
        self._check_count("av", self.limits.max_avs)
        self._n["av"] += 1
        pd.users += 1
        return MockAv(self, pd, attr)

    @verb
    def query_av(self, h_av: Handle) -> AvAttr:
        return self._h_av(h_av).attr

    @verb
    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        av = self._h_av(h_av)
        self._check_av(attr)
        av.attr = attr

    @verb
    def destroy_av(self, h_av: Handle) -> None:
        av = self._h_av(h_av)
        av.alive = False
        av.pd.users -= 1
        self._n["av"] -= 1
