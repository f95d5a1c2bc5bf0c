"""The one vocabulary of what a sans-IO machine asks its I/O layer to do.

Every protocol machine of ibal (RMPP, the SA's transactions, memberships,
subscriptions and registrations, the CM and SIDR, the DM sweep) is a pure
function of events, packets and a clock that returns a list of actions; the
thin I/O layer around it carries them out.  The actions have one set of names,
each a base class here, so a driver reads the same way whichever machine it
drives and a generic driver can dispatch on the base:

=====================  ======================================================
action                 the I/O layer ...
=====================  ======================================================
:class:`Transmit`      sends the message the action carries (a MAD, a CM
                       message, an SA request), adding the addressing
:class:`ArmTimer`      (re)arms the machine's timer: at ``at`` on the
                       machine's clock, or ``delay`` seconds from now; the
                       machine ignores a late or superseded expiry itself
:class:`CancelTimer`   disarms it
:class:`CancelRequest` abandons an outstanding request (its answer is stale)
:class:`Deliver`       hands something to the consumer: a callback, a
                       received message, a result (an upcall)
:class:`Finish`        learns the machine is over, with its outcome
=====================  ======================================================

A machine's own actions subclass these (``rmpp.Transmit``, ``cm.fsm.Deliver``,
``sa.mcast_fsm.TransmitSet``, ...) and add the fields they carry.  Actions
specific to one machine (the CM's ``ModifyQp``, a membership's ``Attach``)
stay its own.  The IBA packet core (:mod:`ibal.transport.core`) speaks the
same vocabulary without objects, since it runs per packet: ``poll()`` is its
Transmit, ``next_deadline()`` its ArmTimer, ``out`` (completions, events) its
Deliver.
"""

from __future__ import annotations


class Action:
    """What a machine asks for; see the module's table."""

    __slots__ = ()


class Transmit(Action):
    """Send a message."""

    __slots__ = ()


class ArmTimer(Action):
    """(Re)arm the machine's timer."""

    __slots__ = ()


class CancelTimer(Action):
    """Disarm the machine's timer."""

    __slots__ = ()


class CancelRequest(Action):
    """Abandon an outstanding request."""

    __slots__ = ()


class Deliver(Action):
    """Hand something to the consumer (an upcall)."""

    __slots__ = ()


class Finish(Action):
    """The machine is over."""

    __slots__ = ()


__all__ = ["Action", "ArmTimer", "CancelRequest", "CancelTimer", "Deliver", "Finish", "Transmit"]
