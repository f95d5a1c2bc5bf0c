"""Typed per-client data on handles (``ib_set_client_data`` without patching attributes).

A layer built on the access layer (the CM, the MAD layer, a ULP) keeps its own
state on the handles it holds under a :class:`StashKey` it owns::

    PORT_STATE = StashKey[MyPortState]()
    ca.stash[PORT_STATE] = MyPortState(...)
    state = ca.stash[PORT_STATE]          # typed: MyPortState

Two layers never collide: keys are objects, not strings.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key for values of type ``T`` in a :class:`Stash`."""

    __slots__ = ()


class Stash:
    """A mapping from :class:`StashKey` to values of the key's type."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._data[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return cast(T, self._data[key])

    def get(self, key: StashKey[T], default: D) -> T | D:
        try:
            return self[key]
        except KeyError:
            return default

    def setdefault(self, key: StashKey[T], default: T) -> T:
        try:
            return self[key]
        except KeyError:
            self[key] = default
            return default

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)
