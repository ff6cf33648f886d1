"""Errors raised by mlxcel-models; each carries a one-line message meant for the user."""


class ModelLoadError(Exception):
    """A model cannot be found, detected or loaded (missing file, unsupported type or quant)."""
