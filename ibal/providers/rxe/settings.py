"""Where the rxe provider's device list comes from, without importing the devices.

Starting the provider with nothing configured must stay cheap: every command
that starts the default providers pays for it (the device and wire modules
take a few hundred milliseconds to import).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

ENV_DEVICES: Final = "IBAL_RXE_DEVICES"
ENV_CONFIG: Final = "IBAL_RXE_CONFIG"


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    """``$IBAL_RXE_CONFIG``, else ``$XDG_CONFIG_HOME/ibal/rxe.toml`` (``~/.config`` by default)."""
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG])
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "ibal" / "rxe.toml"


def configured(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment or the config file names devices."""
    return ENV_DEVICES in env or config_path(env).exists()


__all__ = ["ENV_CONFIG", "ENV_DEVICES", "config_path", "configured"]
