"""Errors raised by mlxcel-models; each carries a one-line message meant for the user."""

from mlxcel_core.errors import InputError


class ModelLoadError(InputError):
    """A model cannot be found, detected or loaded (missing file, unsupported type or quant)."""
