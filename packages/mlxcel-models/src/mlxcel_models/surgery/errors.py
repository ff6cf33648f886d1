"""The error a surgery file raises."""

from mlxcel_models.errors import ModelLoadError


class SurgeryError(ModelLoadError):
    """A surgery file cannot be read, is invalid, or does not fit the model; the message
    starts with `FILE:LINE` of the offending entry and names the value at fault."""
