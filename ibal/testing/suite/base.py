"""The fixtures and helpers every chapter of the conformance suite shares.

A provider author subclasses :class:`~ibal.testing.ProviderConformance`
(which mixes every chapter into :class:`ConformanceBase`) and either names
the provider (``provider_name``/``provider_options``) or overrides the
``provider_factory`` fixture.  Each check gets a fresh ``AlManager`` with a
fresh provider instance started, an open access layer, and tears both down.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import pytest

from ibal.status import IbError, PostError
from ibal.testing.backdoor import CollectingRegistrar, FabricRegistrar, TracingCi
from ibal.testing.fabric import OPTION_CROSS_CA, Verdict, by_attributes, same_fabric
from ibal.testing.helpers import (
    DEFAULT_TIMEOUT,
    Pair,
    RcTiming,
    active_port,
    is_roce,
    make_pair,
)
from ibal.types import PortAttr, QpType, WrType

if TYPE_CHECKING:
    from ibal.al import AccessLayer, AlManager, Ca
    from ibal.ci import Capabilities, ChannelInterface, Provider

F = TypeVar("F", bound=Callable[..., Any])

OPTION_PROVIDER = "ibal_provider"
OPTION_PROVIDER_OPTIONS = "ibal_provider_options"


def traced(fn: F) -> F:
    """Mark a check whose CAs reach the access layer wrapped in a :class:`TracingCi`."""
    fn.ibal_traced = True  # type: ignore[attr-defined]
    return fn


def parse_options(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values are JSON when they parse as JSON."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise pytest.UsageError(f"--ibal-provider-option {pair!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def require(caps: Capabilities, name: str, present: bool | None = None) -> None:
    """Skip the calling check unless capability ``name`` is declared."""
    ok = bool(getattr(caps, name)) if present is None else present
    if not ok:
        pytest.skip(f"provider lacks {name}: {caps.reason(name)}")


def require_qp_type(caps: Capabilities, qp_type: QpType) -> None:
    if qp_type not in caps.qp_types:
        pytest.skip(f"provider lacks qp_types {qp_type.name}: {caps.reason('qp_types')}")


def require_opcode(caps: Capabilities, qp_type: QpType, opcode: WrType) -> None:
    require_qp_type(caps, qp_type)
    if opcode.is_atomic:
        require(caps, "atomics")
    if not caps.supports_opcode(qp_type, opcode):
        pytest.skip(
            f"provider lacks opcodes {qp_type.name}/{opcode.name}: {caps.reason('opcodes')}"
        )


@contextlib.contextmanager
def deviation(caps: Capabilities, rule: str) -> Iterator[None]:
    """Run a strict check of ``rule``; if it fails on a CA that declares it breaks ``rule``
    (``Capabilities.deviations``), report an expected failure naming the reason.

    Never a skip: the check runs, and a declared deviation is listed as one.
    """
    reason = caps.deviation(rule)
    try:
        yield
    except (AssertionError, IbError) as exc:
        if reason is None:
            raise
        pytest.xfail(f"deviation {rule}: {reason} (got {exc})")


@contextlib.contextmanager
def post_raises(cls: type[IbError], failed_index: int) -> Iterator[None]:
    """Expect a post verb to raise ``cls`` as a :class:`PostError` at ``failed_index``."""
    with pytest.raises(cls) as info:
        yield
    err = info.value
    assert isinstance(err, PostError), f"{type(err).__name__} is not a PostError"
    assert err.failed_index == failed_index, (
        f"failed_index {err.failed_index}, expected {failed_index}"
    )


@dataclass
class Fabric:
    """What the ``fabric`` fixture set up: the manager, the provider and its CAs."""

    manager: AlManager
    provider: Provider
    registrar: FabricRegistrar

    def traced(self, guid: int) -> TracingCi:
        """The tracing wrapper of CA ``guid`` (checks marked ``@traced`` only)."""
        try:
            return self.registrar.traced[guid]
        except KeyError:
            raise AssertionError("check is not marked @traced") from None


class ConformanceBase:
    """Fixtures and knobs shared by all chapters (override any of them in a subclass).

    * ``provider_name`` / ``provider_options``: the provider to start by entry
      point name; ``None`` takes ``--ibal-provider`` / ``--ibal-provider-option``.
    * ``supports_reregistration``: ``False`` for providers whose CAs cannot be
      withdrawn and announced again (real hardware); those checks then skip.
    * ``cross_ca``: ``True``/``False`` says whether a provider's CAs share one
      fabric; ``None`` finds out (InfiniBand: same GID prefix, distinct LIDs;
      RoCE: a probe datagram or write between the ports).  ``--ibal-cross-ca``
      overrides it.
    """

    device_required = False
    """Set by a suite whose set-up always yields a device (e.g. rxe on loopback
    addresses): a missing device is then a failure (a port clash, a broken
    socket layer), not a skip that would hide the whole suite."""

    def no_device(self, reason: str) -> NoReturn:
        """Skip (or fail, with :attr:`device_required`) when the provider registered no CA."""
        msg = f"provider has no device: {reason}"
        if self.device_required:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)

    chapter: ClassVar[str] = ""
    provider_name: ClassVar[str | None] = None
    provider_options: ClassVar[Mapping[str, Any]] = {}
    supports_reregistration: ClassVar[bool] = True
    reregistration_reason: ClassVar[str] = "provider declares its CAs cannot be re-registered"
    cross_ca: ClassVar[bool | None] = None
    timeout: ClassVar[float] = DEFAULT_TIMEOUT

    # ------------------------------------------------------------ providers
    def provider_choice(self, config: pytest.Config) -> tuple[str, dict[str, Any]]:
        """The provider name and options this class runs against."""
        if self.provider_name:
            return self.provider_name, dict(self.provider_options)
        name = config.getoption(OPTION_PROVIDER, None)
        if not name:
            raise pytest.UsageError(
                f"{type(self).__name__} names no provider: set provider_name, override "
                "the provider_factory fixture, or pass --ibal-provider NAME"
            )
        opts = parse_options(config.getoption(OPTION_PROVIDER_OPTIONS, None) or [])
        return str(name), opts

    @pytest.fixture
    def provider_factory(self, request: pytest.FixtureRequest) -> Callable[[], Provider]:
        """Makes a fresh, unstarted provider instance per call (override to supply your own)."""
        from ibal.ci import ProviderManager

        name, options = self.provider_choice(request.config)
        manager = ProviderManager()

        def make() -> Provider:
            return manager.create(name, dict(options))

        return make

    @pytest.fixture
    def fabric(
        self, request: pytest.FixtureRequest, provider_factory: Callable[[], Provider]
    ) -> Iterator[Fabric]:
        """A fresh ``AlManager`` with a fresh provider started behind a :class:`FabricRegistrar`."""
        from ibal.al import AlManager

        trace = bool(getattr(request.function, "ibal_traced", False))
        manager = AlManager()
        registrar = FabricRegistrar(manager, trace=trace)
        provider = provider_factory()
        try:
            provider.start(registrar)
            if not registrar.present:
                reason = provider.unavailable_reason or "it registered no CA"
                self.no_device(reason)
            yield Fabric(manager, provider, registrar)
        finally:
            try:
                provider.stop()
            finally:
                manager.close()

    @pytest.fixture
    def al(self, fabric: Fabric) -> Iterator[AccessLayer]:
        """An access layer opened on the fixture's manager (closed afterwards)."""
        al = fabric.manager.open_al()
        yield al
        if not al.closed:
            al.close()

    @pytest.fixture
    def ca(self, al: AccessLayer) -> Ca:
        """The first CA, opened."""
        return al.open_ca(al.get_ca_guids()[0])

    @pytest.fixture
    def caps(self, ca: Ca) -> Capabilities:
        return ca.capabilities

    @pytest.fixture
    def port(self, ca: Ca) -> PortAttr:
        """The CA's first ACTIVE port (every data-path check runs on it)."""
        found = active_port(ca.query().ports)
        if found is None:
            pytest.fail(f"CA {ca.name} has no ACTIVE port: the data-path checks need one")
        return found

    @pytest.fixture(params=["loopback", "two_cas"])
    def peer(
        self, request: pytest.FixtureRequest, al: AccessLayer, ca: Ca, port: PortAttr
    ) -> tuple[Ca, PortAttr]:
        """The other end of a pair: the same port (loopback) or a second CA on the fabric."""
        if request.param == "loopback":
            return ca, port
        return self.second_ca(al, ca, port, request.config)

    def cross_ca_choice(self, config: pytest.Config | None) -> bool | None:
        """``--ibal-cross-ca`` when it forces an answer, else the class's :attr:`cross_ca`."""
        forced = config.getoption(OPTION_CROSS_CA, None) if config is not None else None
        if forced == "yes":
            return True
        if forced == "no":
            return False
        return self.cross_ca

    def second_ca(
        self, al: AccessLayer, ca: Ca, port: PortAttr, config: pytest.Config | None = None
    ) -> tuple[Ca, PortAttr]:
        """A second CA with an ACTIVE port on the same fabric as ``port``, or skip saying why."""
        choice = self.cross_ca_choice(config)
        forced_by = "--ibal-cross-ca=no" if choice is False and self.cross_ca is not False \
            else "cross_ca = False"  # fmt: skip
        if choice is False:
            pytest.skip(f"cross-CA variant: the CAs are declared apart ({forced_by})")
        others = [g for g in al.get_ca_guids() if g != ca.guid]
        if not others:
            pytest.skip("cross-CA variant: the provider offers one CA")
        verdicts = []
        for guid in others:
            other = al.open_ca(guid)
            p = active_port(other.query().ports)
            if p is None:
                verdicts.append(f"{other.name} has no ACTIVE port")
                continue
            if choice:
                return other, p
            verdict = self.same_fabric_verdict(config, ca, port, other, p)
            if verdict.same:
                return other, p
            verdicts.append(f"{ca.name} and {other.name}: {verdict.how}")
        pytest.skip(f"cross-CA variant: no second CA on {ca.name}'s fabric ("
                    + "; ".join(verdicts) + "); --ibal-cross-ca=yes forces it")  # fmt: skip

    def same_fabric_verdict(
        self, config: pytest.Config | None, ca: Ca, port: PortAttr, other: Ca, p: PortAttr
    ) -> Verdict:
        """Auto-detection: InfiniBand by the port attributes, RoCE by trying (kept per run)."""
        try:
            key: Any = self.provider_choice(config) if config is not None else type(self)
            key = (key[0], repr(sorted(key[1].items()))) if isinstance(key, tuple) else key
        except pytest.UsageError:
            key = type(self)
        return same_fabric(key, ca, port, other, p, self.timeout)

    @staticmethod
    def same_fabric(a: PortAttr, b: PortAttr) -> bool:
        """InfiniBand ports with one subnet prefix and distinct LIDs (RoCE: see
        :meth:`same_fabric_verdict`, which tries)."""
        if is_roce(a) or is_roce(b):
            return False
        return by_attributes(a, b).same

    def live_resources(self, ci: ChannelInterface) -> dict[str, int] | None:
        """Backdoor: the provider's live resources on ``ci`` by kind, or ``None`` if unknown.

        The default asks ``ci.resource_counts()`` when the interface offers it;
        override to inspect your provider some other way.
        """
        counts = getattr(ci, "resource_counts", None)
        return dict(counts()) if callable(counts) else None

    def resources_of(self, fabric: Fabric, guid: int) -> dict[str, int]:
        """:meth:`live_resources` of CA ``guid``, or skip when the provider cannot tell."""
        counts = self.live_resources(fabric.registrar.raw[guid])
        if counts is None:
            pytest.skip(
                "provider lacks resource_counts: override live_resources() to count its objects"
            )
        return counts

    def require_reregistration(self) -> None:
        if not self.supports_reregistration:
            pytest.skip(f"provider lacks reregistration: {self.reregistration_reason}")

    # ------------------------------------------------------- direct CI access
    @pytest.fixture
    def raw_cis(self, provider_factory: Callable[[], Provider]) -> Iterator[list[ChannelInterface]]:
        """The provider's channel interfaces with no access layer (the checks open them)."""
        registrar = CollectingRegistrar()
        provider = provider_factory()
        provider.start(registrar)
        try:
            if not registrar.cis:
                reason = provider.unavailable_reason or "it registered no CA"
                self.no_device(reason)
            yield list(registrar.cis.values())
        finally:
            provider.stop()

    # ------------------------------------------------------------- pairs
    def pair(
        self,
        ca: Ca,
        port: PortAttr,
        peer: tuple[Ca, PortAttr],
        qp_type: QpType,
        *,
        timing: RcTiming | None = None,
        connect_b: bool = True,
        do_connect: bool = True,
        **create: Any,
    ) -> Pair:
        """Two QPs of ``qp_type`` from ``port`` to ``peer``, ready to move data."""
        require_qp_type(ca.capabilities, qp_type)
        ca_b, port_b = peer
        return make_pair(
            ca,
            port,
            ca_b,
            port_b,
            qp_type,
            timing=timing,
            connect_b=connect_b,
            do_connect=do_connect,
            **create,
        )

    def loop(self, ca: Ca, port: PortAttr, qp_type: QpType, **kw: Any) -> Pair:
        """A loopback pair on one port."""
        return self.pair(ca, port, (ca, port), qp_type, **kw)
