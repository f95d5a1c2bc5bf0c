"""The conformance suite: every chapter mixed into :class:`ProviderConformance`.

A provider author writes::

    from ibal.testing import ProviderConformance

    class TestMine(ProviderConformance):
        provider_name = "mine"
"""

from __future__ import annotations

from ibal.testing.suite.base import ConformanceBase, Fabric, parse_options, require, traced
from ibal.testing.suite.ch_ca import CaChecks
from ibal.testing.suite.ch_concurrency import AsyncioChecks, ThreadChecks
from ibal.testing.suite.ch_contract import ContractChecks
from ibal.testing.suite.ch_cq import CqChecks
from ibal.testing.suite.ch_data import DataPathChecks
from ibal.testing.suite.ch_destroy import DestroyChecks
from ibal.testing.suite.ch_direct import DirectChecks
from ibal.testing.suite.ch_edges import EdgeChecks
from ibal.testing.suite.ch_errors import ErrorCompletionChecks
from ibal.testing.suite.ch_events import EventChecks
from ibal.testing.suite.ch_fmr import FmrChecks
from ibal.testing.suite.ch_handles import HandleChecks
from ibal.testing.suite.ch_inv import InvalidateChecks
from ibal.testing.suite.ch_mad import MadChecks
from ibal.testing.suite.ch_mcast import McastChecks, SpecialQpChecks
from ibal.testing.suite.ch_mr import MrChecks
from ibal.testing.suite.ch_mw import MwChecks
from ibal.testing.suite.ch_pd_av import AvChecks, PdChecks
from ibal.testing.suite.ch_post import PostChecks
from ibal.testing.suite.ch_qp import QpChecks
from ibal.testing.suite.ch_qp_state import QpStateChecks
from ibal.testing.suite.ch_registration import RegistrationChecks
from ibal.testing.suite.ch_srq import SrqChecks

CHAPTERS: tuple[type[ConformanceBase], ...] = (
    CaChecks,
    ContractChecks,
    DirectChecks,
    PdChecks,
    AvChecks,
    CqChecks,
    QpChecks,
    PostChecks,
    DataPathChecks,
    ErrorCompletionChecks,
    QpStateChecks,
    MrChecks,
    FmrChecks,
    MwChecks,
    InvalidateChecks,
    EdgeChecks,
    SrqChecks,
    McastChecks,
    SpecialQpChecks,
    MadChecks,
    EventChecks,
    DestroyChecks,
    HandleChecks,
    RegistrationChecks,
    ThreadChecks,
    AsyncioChecks,
)
"""The chapters, in the order the suite reports them."""


# Listed last-chapter-first: pytest collects inherited checks in reverse MRO order,
# so the report then runs from the first chapter to the last.
class ProviderConformance(
    AsyncioChecks,
    ThreadChecks,
    RegistrationChecks,
    HandleChecks,
    DestroyChecks,
    EventChecks,
    MadChecks,
    SpecialQpChecks,
    McastChecks,
    SrqChecks,
    EdgeChecks,
    InvalidateChecks,
    MwChecks,
    FmrChecks,
    MrChecks,
    QpStateChecks,
    ErrorCompletionChecks,
    DataPathChecks,
    PostChecks,
    QpChecks,
    CqChecks,
    AvChecks,
    PdChecks,
    DirectChecks,
    ContractChecks,
    CaChecks,
):
    """Every conformance check; subclass it (``Test*``) and name or supply your provider."""

    chapter = ""


__all__ = [
    "CHAPTERS",
    "ConformanceBase",
    "Fabric",
    "ProviderConformance",
    "parse_options",
    "require",
    "traced",
]
