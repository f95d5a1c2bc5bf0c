"""Address vectors (``ib_create_av`` and friends): synchronous create, query, modify, destroy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.al import ranges
from ibal.al.obj import CaObject
from ibal.status import InvalidAvHandle, InvalidParameter, InvalidPort
from ibal.types import AvAttr

if TYPE_CHECKING:
    from ibal.al.cica import CiCa
    from ibal.al.pd import Pd


def check_av_attr(attr: object, cica: CiCa) -> AvAttr:
    """``attr`` as an ``AvAttr`` whose port exists on the CA (eager, as decided)."""
    if not isinstance(attr, AvAttr):
        raise InvalidParameter("an AvAttr is required")
    if type(attr.port_num) is not int:
        raise InvalidPort(f"port_num must be an int, not {attr.port_num!r:.40}")
    ranges.check_av(attr)
    if cica.port(attr.port_num) is None:
        raise InvalidPort(f"CA {cica.name} has no port {attr.port_num}")
    return attr


class Av(CaObject):
    """An address vector on a PD; UD sends name it in ``UdDest.av``."""

    _invalid = InvalidAvHandle
    _rank = 40
    _kind = "AV"
    _sync_destroy = True

    def __init__(self, pd: Pd) -> None:
        super().__init__(pd)
        self._pd = pd

    @property
    def pd(self) -> Pd:
        """The PD the AV was created on."""
        return self._pd

    def query(self) -> AvAttr:
        """``ib_query_av``: the current attributes (the PD is ``av.pd``)."""
        self._use()
        try:
            return self._ci.query_av(self._h)
        finally:
            self._unuse()

    def modify(self, attr: AvAttr) -> None:
        """``ib_modify_av``."""
        self._check()
        attr = check_av_attr(attr, self._cica)
        self._use()
        try:
            self._ci.modify_av(self._h, attr)
        finally:
            self._unuse()

    def destroy(self) -> None:
        """``ib_destroy_av``: synchronous; the handle is invalid afterwards."""
        self._destroy_now()

    def _cleanup(self) -> None:
        self._ci.destroy_av(self._h)
