"""Values derived from an immutable object, computed once while that object is in use.

Providers hand out the same frozen ``CaAttr``/``PortAttr`` until something changes, so a
lookup table built from one (GID -> index, P_Key -> index) serves every connection of a
burst.  An entry holds its object, so the ``id`` it is keyed by is not reused while it
stands; the memo is cleared when it grows past a small bound (new attributes replace the
old ones only on a port change).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["derived"]

_V = TypeVar("_V")
_MAX = 256
_memo: dict[tuple[int, str], tuple[object, Any]] = {}


def derived(obj: object, name: str, build: Callable[[], _V]) -> _V:
    """``build()``'s value for ``obj`` under ``name``, built on the first call for ``obj``.

    Any thread; never blocks.  ``obj`` must not change (a frozen record)."""
    hit = _memo.get((id(obj), name))
    if hit is not None and hit[0] is obj:
        return hit[1]  # type: ignore[no-any-return]
    value = build()
    if len(_memo) >= _MAX:
        _memo.clear()
    _memo[(id(obj), name)] = (obj, value)
    return value
