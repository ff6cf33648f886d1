"""The error a bad LoRA adapter raises."""

from mlxcel_models.errors import ModelLoadError


class AdapterLoadError(ModelLoadError):
    """A LoRA adapter cannot be loaded or does not fit the model; the message names the
    path or tensor at fault, in one line."""
