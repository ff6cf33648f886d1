"""Reading tuned values where they are used: inert unless `MLXCEL_AUTOTUNE` is set.

`Tunings.from_environ` reads the store once; each lookup after that is a dict lookup, so
a value read on every decode step costs next to nothing. Libraries do not read the
environment: a command builds its `Tunings` from the environment it was given and
installs them for code with no caller to hand it settings (a kernel launched from deep
inside a model's forward pass), which reads `installed_tunings()`. Until then it is none.
"""

from __future__ import annotations

from collections.abc import Mapping

from mlxcel_core.tuning.store import TuningScope, TuningStore, autotune_dir

AUTOTUNE_VARIABLE = "MLXCEL_AUTOTUNE"


def autotune_enabled(environ: Mapping[str, str]) -> bool:
    """Whether `MLXCEL_AUTOTUNE` asks for tuned values: set, not empty and not "0"."""
    return environ.get(AUTOTUNE_VARIABLE, "") not in ("", "0")


class Tunings:
    """Tuned values by (tactic, bucket), or none at all.

    Args:
        values: the values to serve; None when tuning is off, so every lookup gives
            its default.
    """

    def __init__(self, values: Mapping[tuple[str, str], int] | None) -> None:
        self._values = None if values is None else dict(values)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], scope: TuningScope | None = None) -> Tunings:
        """The stored values of `scope` (None: the default device under the running MLX)
        in `environ`'s cache folder when `autotune_enabled(environ)`, else none."""
        if not autotune_enabled(environ):
            return cls(None)
        store = TuningStore(autotune_dir(environ), scope or TuningScope.current())
        return cls({key: entry.value for key, entry in store.read().items()})

    @property
    def enabled(self) -> bool:
        return self._values is not None

    def value(self, tactic: str, bucket: str, default: int) -> int:
        """The tuned value of `tactic` for `bucket`, else `default`."""
        tuned = self.tuned(tactic, bucket)
        return default if tuned is None else tuned

    def tuned(self, tactic: str, bucket: str) -> int | None:
        """The tuned value of `tactic` for `bucket`; None when none is stored or tuning is
        off."""
        if self._values is None:
            return None
        return self._values.get((tactic, bucket))


_installed = Tunings(None)


def install_tunings(tunings: Tunings) -> None:
    """Make `tunings` the process's, for every later `installed_tunings()`."""
    global _installed
    _installed = tunings


def installed_tunings() -> Tunings:
    """The tunings last installed; none (every lookup its default) before any."""
    return _installed
