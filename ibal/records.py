"""``record``: a slotted dataclass whose ``__repr__``, ``__eq__`` and ``__hash__`` are shared.

Python 3.11's ``dataclass`` compiles each method it generates with its own ``exec`` at
import, ~0.1 ms a method; a frozen dataclass makes six.  The shared methods here behave
as the generated ones (same text, same equality and hashing of the compared fields, in
order), so a record costs only its ``__init__`` (and, frozen, ``__setattr__`` and
``__delattr__``) at import: the records every ``ibal`` command imports cost about half.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["record"]

_T = TypeVar("_T", bound=type)


def _repr(self: Any) -> str:
    cls = type(self)
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in cls.__record_repr__)
    return f"{cls.__qualname__}({inner})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__record_key__
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(self.__record_hash__(self))


def _key(names: tuple[str, ...]) -> Callable[[Any], Any]:
    """The compared fields' values, as a tuple (``attrgetter`` of one name gives the value)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


@overload
def record(cls: _T, /) -> _T: ...


@overload
def record(*, frozen: bool = False, kw_only: bool = False) -> Callable[[_T], _T]: ...


@dataclass_transform()
def record(
    cls: _T | None = None, /, *, frozen: bool = False, kw_only: bool = False
) -> _T | Callable[[_T], _T]:
    """``@dataclass(slots=True, frozen=..., kw_only=...)`` with shared repr/eq/hash methods.

    Frozen records hash as a frozen dataclass does (the compared fields, or those
    with ``field(hash=True)``); the others are unhashable, as a dataclass with ``eq``
    is.  Unlike the generated ``__repr__``, the shared one has no guard against a
    record that contains itself.
    """

    def wrap(c: _T) -> _T:
        made: Any = dataclasses.dataclass(
            c, frozen=frozen, kw_only=kw_only, slots=True, repr=False, eq=False
        )
        fields = dataclasses.fields(made)
        made.__record_repr__ = tuple(f.name for f in fields if f.repr)
        made.__record_key__ = staticmethod(_key(tuple(f.name for f in fields if f.compare)))
        hashed = (f.name for f in fields if (f.compare if f.hash is None else f.hash))
        made.__record_hash__ = staticmethod(_key(tuple(hashed)))
        made.__repr__ = _repr
        made.__eq__ = _eq
        made.__hash__ = _hash if frozen else None
        return made  # type: ignore[no-any-return]

    return wrap if cls is None else wrap(cls)
