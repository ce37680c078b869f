"""Optional libraries (NVIDIA DALI, LitData, SPDL, the fast decoders): whether one is installed,
and how to install it."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from facebench.errors import ConfigError


@dataclass(frozen=True)
class Requirement:
    """A Python package that a loader or a shard format needs, and the extra that installs it."""

    package: str  # as imported: "nvidia.dali"
    extra: str  # pip install -e ".[<extra>]"

    def available(self) -> bool:
        try:
            return importlib.util.find_spec(self.package) is not None
        except ModuleNotFoundError:  # a parent package ("nvidia") is missing
            return False

    def install_hint(self) -> str:
        return f"pip install -e '.[{self.extra}]'"

    def require(self, what: str) -> None:
        """Refuse `what` (e.g. "loader=dali"), with the install command, when it is missing."""
        if not self.available():
            raise ConfigError(
                f"{what} needs {self.package}, which is not installed: {self.install_hint()}"
            )
