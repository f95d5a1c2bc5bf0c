"""The ``ibal`` pytest plugin: ``--ibal-provider NAME`` runs the conformance suite.

Registered through the ``pytest11`` entry point, so it loads with every pytest
run; it therefore imports nothing from the access layer.  With
``--ibal-provider`` and no test paths on the command line it collects the
suite (``ibal/testing/suite/``, whose ``test_provider.py`` holds the one test
class) instead of the current directory's tests, so ``pytest --ibal-provider
mock`` works from anywhere.
Every check is marked ``ibal_chapter(NAME)``.

It also provides the ibsim fixtures (:mod:`ibal.testing.ibsim`, imported when
used): ``ibsim_fabric`` (the small net file of ``tests/data/ibsim``, OpenSM up,
one per test), ``ibsim_module_fabric`` (the same, one per test module: for
tests that only query it and leave links, counters they compare and SM state
as they found them) and ``ibsim_factory`` (``ibsim_factory(netfile, **Fabric
options)``).  All skip naming the missing Debian packages, and fail instead
with ``IBAL_LAB_REQUIRED=1``.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ibal.testing.ibsim import Fabric

SUITE_FILE = Path(__file__).resolve().parent / "suite" / "test_provider.py"
"""The module whose ``TestProvider`` runs against ``--ibal-provider``."""

CHAPTER_MARKER = "ibal_chapter"
_REWRITE = ("ibal.testing.suite", "ibal.testing.helpers")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ibal", "ibal provider conformance")
    group.addoption(
        "--ibal-provider",
        dest="ibal_provider",
        default=None,
        metavar="NAME",
        help="run the ibal conformance suite against provider NAME (an ibal.providers entry point)",
    )
    group.addoption(
        "--ibal-provider-option",
        dest="ibal_provider_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a provider option (repeatable); VALUE is parsed as JSON when it can be",
    )
    group.addoption(
        "--ibal-cross-ca",
        dest="ibal_cross_ca",
        default="auto",
        choices=("auto", "yes", "no"),
        help="whether the provider's CAs share one fabric for the cross-CA checks: auto "
        "(InfiniBand by the port attributes, RoCE by a probe), yes or no (default auto)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The checks live in a package, not in test files: have pytest explain failed asserts.
    fresh = [m for m in _REWRITE if m not in sys.modules]
    if fresh:
        pytest.register_assert_rewrite(*fresh)
    config.addinivalue_line(
        "markers", f"{CHAPTER_MARKER}(name): the ibal conformance chapter a check belongs to"
    )
    config.addinivalue_line(
        "markers", "ibal_rules(*ids): the rules a conformance check proves (ibal.testing.rules)"
    )
    if config.getoption("ibal_provider", None) and config.args_source is not (
        pytest.Config.ArgsSource.ARGS
    ):
        # The directory, not the file: node ids then read "test_provider.py::TestProvider::..."
        config.args = [str(SUITE_FILE.parent)]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without ``--ibal-provider`` the provider-less suite module is not collected."""
    if collection_path == SUITE_FILE and not config.getoption("ibal_provider", None):
        return True
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect the suite module even where ``python_files`` would not match its name."""
    if file_path != SUITE_FILE or not parent.config.getoption("ibal_provider", None):
        return None
    patterns = parent.config.getini("python_files") or ["test_*.py"]
    if any(fnmatch.fnmatch(file_path.name, pat) for pat in patterns):
        return None  # the python plugin collects it
    return pytest.Module.from_parent(parent, path=file_path)


def pytest_report_header(config: pytest.Config) -> str | None:
    name = config.getoption("ibal_provider", None)
    if not name:
        return None
    opts = config.getoption("ibal_provider_options", None) or []
    return f"ibal conformance: provider {name!r}" + (f", options {' '.join(opts)}" if opts else "")


def _defining_class(item: pytest.Item) -> type | None:
    cls: type | None = getattr(item, "cls", None)
    if cls is None:
        return None
    name = getattr(item, "originalname", None) or item.name
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def chapter_of(item: pytest.Item) -> str | None:
    """The conformance chapter of ``item`` (the ``chapter`` of the class defining the check)."""
    klass = _defining_class(item)
    chapter = vars(klass).get("chapter") if klass is not None else None
    return chapter if isinstance(chapter, str) and chapter else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each check with its chapter; its chapter class name becomes a ``-k`` keyword."""
    for item in items:
        chapter = chapter_of(item)
        if chapter is None:
            continue
        item.add_marker(pytest.mark.ibal_chapter(chapter))
        item.user_properties.append(("ibal_chapter", chapter))
        klass = _defining_class(item)
        if klass is not None:
            item.extra_keyword_matches.add(klass.__name__)


# ------------------------------------------------------------------ ibsim fixtures


def ibsim_required() -> None:
    """Skip the calling test unless ibsim, OpenSM, umad2sim and infiniband-diags are
    installed (naming the missing Debian packages); fail instead with IBAL_LAB_REQUIRED=1."""
    from ibal.testing.ibsim import missing_packages

    missing = missing_packages()
    if not missing:
        return
    msg = f"needs the Debian packages: {' '.join(missing)}"
    if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
        pytest.fail(f"{msg} (IBAL_LAB_REQUIRED is set)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture
def ibsim_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Fabric]]:
    """``start(netfile, **options) -> Fabric``: fabrics stopped (logs kept) when the test ends.

    The logs of ibsim and OpenSM are attached to the test's report (shown if it fails).
    """
    from ibal.testing.ibsim import Fabric

    ibsim_required()
    started: list[Fabric] = []

    def start(netfile: Path, **options: Any) -> Fabric:
        fabric = Fabric(netfile, tmp_path / f"fabric{len(started)}", **options)
        started.append(fabric)
        fabric.start()
        return fabric

    try:
        yield start
    finally:
        for fabric in reversed(started):
            fabric.stop()
            request.node.add_report_section("teardown", f"ibsim {fabric.netfile.name}",
                                            fabric.logs())  # fmt: skip


@pytest.fixture
def ibsim_fabric(ibsim_factory: Callable[..., Fabric]) -> Fabric:
    """ibsim on ``tests/data/ibsim/small.net`` (SmHca runs OpenSM; Host and Peer are free)."""
    from ibal.testing.ibsim import DATA_DIR

    return ibsim_factory(DATA_DIR / "small.net")


@pytest.fixture(scope="module")
def _ibsim_module_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    from ibal.testing.ibsim import DATA_DIR, Fabric

    ibsim_required()
    fabric = Fabric(DATA_DIR / "small.net", tmp_path_factory.mktemp("ibsim-module"))
    fabric.start()
    try:
        yield fabric
    finally:
        fabric.stop()


@pytest.fixture
def ibsim_module_fabric(
    request: pytest.FixtureRequest, _ibsim_module_fabric: Fabric
) -> Iterator[Fabric]:
    """``ibsim_fabric`` shared by the tests of one module (ibsim + OpenSM start once).

    For tests that do not change the fabric (no unlink, no SM restart, no
    counter another test compares); a test that does takes ``ibsim_fabric``.
    Each test first checks that ibsim and OpenSM still run, and gets their
    logs attached to its report.
    """
    fabric = _ibsim_module_fabric
    fabric.check_alive()
    try:
        yield fabric
    finally:
        request.node.add_report_section("teardown", f"ibsim {fabric.netfile.name}",
                                        fabric.logs())  # fmt: skip
