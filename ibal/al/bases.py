"""The base classes of the PD and QP handles, for the modules that check for them.

``mr`` checks the PD a region moves to and the QP a window is bound through;
``pd`` creates both regions and QPs.  Checking for these bases instead of
:class:`~ibal.al.pd.Pd` and :class:`~ibal.al.qp.Qp` keeps ``mr`` from importing
the modules built on it.  Each has one subclass (``Pd``, and ``Qp`` through
``QpWork``), so the check is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.al.obj import CaObject
from ibal.status import InvalidPdHandle, InvalidQpHandle

if TYPE_CHECKING:
    from ibal.al.pd import Pd
    from ibal.types import QpState, QpType

__all__ = ["PdBase", "QpBase"]


class PdBase(CaObject):
    """What makes a handle a PD: its error and name."""

    _invalid = InvalidPdHandle
    _kind = "PD"


class QpBase(CaObject):
    """What makes a handle a QP: its error and name, its type, PD and state."""

    _invalid = InvalidQpHandle
    _kind = "QP"

    _pd: Pd
    _qp_type: QpType
    _qp_state: QpState

    @property
    def qp_type(self) -> QpType:
        return self._qp_type

    @property
    def pd(self) -> Pd:
        return self._pd

    @property
    def state(self) -> QpState:
        """The state as the AL knows it: set by ``modify``/``query`` and moved by the
        errors the provider reports (async events, error completions polled)."""
        return self._qp_state
