"""Discovery, the pyverbs import and "no device" behaviour, on any host.

This host (and CI containers) have no RDMA device: the provider must load,
register no CA, say why, and break nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

from ibal.ci import ChannelInterface, ProviderManager, ProviderRegistry
from ibal.providers.rdma_core import loader
from ibal.providers.rdma_core.plugin import ibal_register_providers


class Registrar:
    def __init__(self) -> None:
        self.cis: list[ChannelInterface] = []

    def register_ca(self, ci: ChannelInterface) -> None:
        self.cis.append(ci)

    def deregister_ca(self, guid: int) -> None:
        self.cis = [c for c in self.cis if c.guid != guid]


def test_plugin_registers_the_provider_without_importing_pyverbs() -> None:
    code = (
        "import sys, json\n"
        "from ibal.ci import ProviderRegistry\n"
        "from ibal.providers.rdma_core.plugin import ibal_register_providers\n"
        "r = ProviderRegistry(); ibal_register_providers(registry=r)\n"
        "print(json.dumps([[s.name for s in r.specs()], 'pyverbs' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, imported = json.loads(out.stdout)
    assert names == ["rdma_core"]
    assert imported is False


def test_entry_point_is_found_by_the_provider_manager() -> None:
    pm = ProviderManager()
    assert "rdma_core" in pm.names()
    provider = pm.create("rdma_core")
    assert provider.name == "rdma_core"


def _start() -> tuple[Any, Registrar]:
    registry = ProviderRegistry()
    ibal_register_providers(registry=registry)
    spec = registry.get("rdma_core")
    assert spec is not None
    provider = spec.factory({})
    reg = Registrar()
    provider.start(reg)
    return provider, reg


def test_no_device_registers_nothing_and_says_why() -> None:
    try:
        loader.load()
    except loader.PyverbsUnavailable:
        pytest.skip("needs python3-pyverbs to reach the device probe")
    provider, reg = _start()
    if reg.cis:
        provider.stop()
        pytest.skip("this host has an RDMA device")
    assert reg.cis == []
    assert provider.unavailable_reason is not None
    assert provider.unavailable_reason.startswith("no RDMA device (")
    assert "Failed to get devices list" in provider.unavailable_reason
    provider.stop()  # nothing to withdraw; must not raise


def test_without_pyverbs_registers_nothing_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise loader.PyverbsUnavailable("No module named 'pyverbs' (install python3-pyverbs)")

    monkeypatch.setattr(loader, "load", fail)
    provider, reg = _start()
    assert reg.cis == []
    assert provider.unavailable_reason == (
        "pyverbs not importable: No module named 'pyverbs' (install python3-pyverbs)"
    )


def test_al_manager_records_the_reason_and_keeps_working() -> None:
    from ibal.al import AlManager

    with AlManager() as mgr:
        provider = mgr.start_provider("rdma_core")
        if provider.unavailable_reason is None:
            pytest.skip("this host has an RDMA device")
        al = mgr.open_al()
        assert al.get_ca_guids() == []
        al.close()


def test_unknown_option_is_refused() -> None:
    from ibal.providers.rdma_core.provider import RdmaCoreProvider

    with pytest.raises(ValueError, match="unknown rdma_core options"):
        RdmaCoreProvider({"bogus": 1})


# ------------------------------------------------------------------ loader


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, check=False
    )


def test_narrow_finder_exposes_pyverbs_only() -> None:
    if not (loader.DEBIAN_DIST_PACKAGES / "pyverbs").is_dir():
        pytest.skip("needs python3-pyverbs (apt-get install python3-pyverbs)")
    code = (
        "import json, logging, sys\n"
        "before = list(logging.getLogger().handlers)\n"
        "from ibal.providers.rdma_core import loader\n"
        "try:\n"
        "    import pyverbs\n"
        "    direct = True\n"
        "except ImportError:\n"
        "    direct = False\n"
        "pv = loader.load()\n"
        "import pyverbs.qp\n"
        "try:\n"
        "    import apt_pkg\n"
        "    leaked = True\n"
        "except ImportError:\n"
        "    leaked = False\n"
        "print(json.dumps({'direct': direct, 'file': pv.__file__, 'leaked': leaked,\n"
        "  'path': '/usr/lib/python3/dist-packages' in sys.path,\n"
        "  'handlers': logging.getLogger().handlers == before}))\n"
    )
    r = _fresh(code)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    if info["direct"]:
        pytest.skip("pyverbs is importable directly here (system Python or system-site venv)")
    assert info["file"].startswith(str(loader.DEBIAN_DIST_PACKAGES))
    assert info["leaked"] is False, "the finder must not expose the rest of dist-packages"
    assert info["path"] is False, "sys.path must stay untouched"
    assert info["handlers"] is True, "pyverbs' logging.basicConfig must be undone"


def test_missing_pyverbs_names_the_package(tmp_path: Path) -> None:
    code = (
        "from ibal.providers.rdma_core import loader\n"
        f"loader.DEBIAN_DIST_PACKAGES = loader.Path({str(tmp_path)!r})\n"
        "try:\n"
        "    loader.load()\n"
        "except loader.PyverbsUnavailable as exc:\n"
        "    print('UNAVAILABLE', exc)\n"
    )
    r = _fresh(code)
    assert r.returncode == 0, r.stderr
    if "UNAVAILABLE" not in r.stdout:
        pytest.skip("pyverbs is importable directly here")
    assert "python3-pyverbs" in r.stdout


def test_abi_mismatch_is_explained(tmp_path: Path) -> None:
    pkg = tmp_path / "pyverbs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "qp.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")
    why = loader.abi_mismatch(pkg)
    assert why is not None and "cpython-39" in why and "Python 3.9" in why
    mine = next(s for s in EXTENSION_SUFFIXES if s.startswith(".cpython"))
    (pkg / "qp.cpython-39-x86_64-linux-gnu.so").rename(pkg / f"qp{mine}")
    assert loader.abi_mismatch(pkg) is None


def test_finder_answers_for_pyverbs_only(tmp_path: Path) -> None:
    pkg = tmp_path / "pyverbs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (tmp_path / "other.py").write_text("")
    f = loader.PyverbsFinder(tmp_path)
    spec = f.find_spec("pyverbs", None)
    assert spec is not None and spec.origin == str(pkg / "__init__.py")
    assert f.find_spec("other", None) is None
    assert f.find_spec("pyverbs.qp", None) is None  # submodules go through __path__
