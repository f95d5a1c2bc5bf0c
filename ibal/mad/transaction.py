"""IBMF's two transaction kinds over a MAD service (``ibmf_msg_transport``).

*Unsequenced* is a one-way send (a response, a trap, a Send): that is
:meth:`MadService.send` of an element with ``resp_expected`` False.
*Sequenced* (``IBMF_MSG_TRANS_FLAG_SEQ``) is a request that completes when its
whole response has arrived or on error; without a callback it blocks:
:func:`transact`.  With a callback it is :meth:`MadService.send_taken`.
The per-attempt time-out is ``element.timeout_ms`` (IBMF's ``rtv + rttv``) and
at most ``1 + retry_cnt`` sends go out, as the AL's transport counts them.
"""

from __future__ import annotations

import contextlib
import threading

from ibal.al import in_callback
from ibal.mad.pool import MadElement
from ibal.mad.service import MadService
from ibal.status import Canceled, IbError, InvalidState, Timeout
from ibal.types import WcStatus


def transact(service: MadService, request: MadElement, timeout: float | None = None
             ) -> MadElement:
    """Send ``request`` and block until its response, which is returned (an element
    of the service's pool key, linked to ``request``; give it back with ``put_mad``).

    Raises ``Timeout`` when no response came after the retries (or ``timeout``
    seconds of wall time passed: the send is then canceled), ``Canceled`` when
    the service went away, the matching status error for a failed send, and
    ``InvalidState`` on an AL callback thread (the response could never be
    delivered there).
    """
    if in_callback():
        raise InvalidState("transact blocks: call it off the AL's callback threads")
    done = threading.Event()
    outcome: list[tuple[WcStatus, MadElement | None]] = []

    def take(status: WcStatus, response: MadElement | None) -> None:
        outcome.append((status, response))
        done.set()

    service.send_taken(request, take)
    if not done.wait(timeout):
        with contextlib.suppress(IbError):  # NotFound: it ended meanwhile
            service.cancel(request)
        done.wait()
        if outcome and outcome[0][1] is None:
            raise Timeout(f"no response within {timeout} s")
    status, response = outcome[0]
    if response is not None:
        return response
    if status is WcStatus.TIMEOUT_RETRY_ERR:
        raise Timeout("no response after the retries")
    if status is WcStatus.CANCELED:
        raise Canceled("the request was canceled")
    raise IbError(f"the send failed: {status.name}")
