"""What every group of rxe verbs shares: the CA's state, its lock, handle checks.

:class:`CaState` is the base of the verb mixins (:mod:`.ca`, :mod:`.mr_verbs`,
:mod:`.qp_verbs`); it declares the state they work on so each file stays one
job.  :func:`serialized` runs a verb under the CA lock, which the engine's
threads take too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from ibal.ci import Capabilities
from ibal.providers.rxe.cq import Cq
from ibal.providers.rxe.device import Device
from ibal.providers.rxe.engine import Engine
from ibal.providers.rxe.memory import KeyTable, Mr, Mw, Pd
from ibal.providers.rxe.qps import Av, McastAttach, Qp, Srq
from ibal.providers.softca import SoftCa
from ibal.status import (
    InvalidAvHandle,
    InvalidCqHandle,
    InvalidMcastHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
    Unsupported,
)
from ibal.types import CaAttr, SrqAttr

P = ParamSpec("P")
R = TypeVar("R")
H = TypeVar("H")

PORT = 1


class CaState(SoftCa):
    """The state of one rxe CA that its verbs share."""

    name: str
    device: Device
    engine: Engine
    keys: KeyTable
    attr: CaAttr
    _lock: threading.RLock
    _n: dict[str, int]

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    def unsupported(self, name: str) -> Unsupported:
        return Unsupported(f"{name}: {self.capabilities.reason(name)}")

    def _verb(self, name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        with self._lock:
            return fn(*args, **kwargs)

    @property
    def _lim(self) -> CaAttr:
        return self.attr

    def _make_srq(self, pd: Pd, attr: SrqAttr, context: Any) -> Srq:
        return Srq(self, pd, attr.max_wr, attr.max_sge, attr.srq_limit, context)

    def _h_pd(self, h: Any) -> Pd:
        return self._own(h, Pd, InvalidPdHandle, "a PD")

    def _h_cq(self, h: Any) -> Cq:
        return self._own(h, Cq, InvalidCqHandle, "a CQ")

    def _h_qp(self, h: Any) -> Qp:
        return self._own(h, Qp, InvalidQpHandle, "a QP")

    def _h_srq(self, h: Any) -> Srq:
        return self._own(h, Srq, InvalidSrqHandle, "an SRQ")

    def _h_av(self, h: Any) -> Av:
        return self._own(h, Av, InvalidAvHandle, "an AV")

    def _h_mr(self, h: Any) -> Mr:
        return self._own(h, Mr, InvalidMrHandle, "an MR")

    def _h_mw(self, h: Any) -> Mw:
        return self._own(h, Mw, InvalidMwHandle, "an MW")

    def _h_mcast(self, h: Any) -> McastAttach:
        return self._own(h, McastAttach, InvalidMcastHandle, "a multicast attachment")


def serialized(fn: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Run a verb under the CA lock."""

    @functools.wraps(fn)
    def locked(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return fn(self, *args, **kwargs)

    return locked
