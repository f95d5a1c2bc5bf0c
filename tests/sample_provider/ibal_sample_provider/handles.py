"""Handles: the opaque objects the provider gives the access layer.

The contract lets a provider use any object as a handle; the access layer never
looks inside and hands it back to name the resource.  Here every handle is a
plain Python object that remembers which CA made it and whether it has been
destroyed, so each verb can refuse a foreign or stale handle with the matching
``Invalid*Handle`` exception (see :func:`check`).

A C driver would hand out pointers or table indices instead; the checks are the
same.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ibal.status import IbError
from ibal.types import AvAttr


class Resource:
    """Base of every handle: the CA that owns it and whether it is still alive."""

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.alive = True


class CaHandle(Resource):
    """What ``open_ca`` returns: the one open instance of the CA."""


class Pd(Resource):
    """A protection domain: it only counts what uses it (AVs, QPs, MRs)."""

    def __init__(self, owner: object) -> None:
        super().__init__(owner)
        self.users = 0


class Av(Resource):
    """An address vector: where a UD send goes."""

    def __init__(self, owner: object, pd: Pd, attr: AvAttr) -> None:
        super().__init__(owner)
        self.pd = pd
        self.attr = attr


R = TypeVar("R", bound=Resource)


def check(handle: Any, kind: type[R], owner: object, error: type[IbError]) -> R:
    """``handle`` if it is a live ``kind`` made by ``owner``, else raise ``error``."""
    if isinstance(handle, kind) and handle.owner is owner and handle.alive:
        return handle
    raise error(f"not a live {kind.__name__} of this CA")
