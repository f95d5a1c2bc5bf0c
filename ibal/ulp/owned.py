"""The verbs objects a channel driver's connection holds, and their release.

A connection keeps its QP, CQ, regions and PD as attributes named in release
order (the QP before its CQ, regions before their PD); the NVMe target's
queues and the SRP initiator list theirs and let these two walk them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ibal.status import IbError


def live_owned(holder: object, names: Sequence[str]) -> list[object]:
    """The live objects ``holder`` keeps under ``names``."""
    objs = (getattr(holder, n, None) for n in names)
    return [o for o in objs if o is not None and o.alive]


def release_owned(holder: Any, names: Sequence[str]) -> None:
    """Destroy what ``holder`` keeps under ``names``, in that order, then close its CA;
    what is gone already is passed over (``qp``/``cq`` destroyed, ``pd`` deallocated,
    any other name a region deregistered)."""
    for name in names:
        obj = getattr(holder, name, None)
        if obj is None or not obj.alive:
            continue
        with contextlib.suppress(IbError):
            if name in ("qp", "cq"):
                obj.destroy(wait=True)
            elif name == "pd":
                obj.dealloc(wait=True)
            else:
                obj.dereg()
    if holder.ca.alive:
        holder.ca.close(wait=True)
