"""The one error an unusable image reference raises."""

from __future__ import annotations

from mlxcel_core.errors import InputError


class ImageInputError(InputError, ValueError):
    """An image that cannot be used, and why; the message is fit to show the sender.

    Args:
        number: the image's 1-based number within its request.
        reason: why it cannot be used ("corrupt base64: ...", "fetching is disabled").

    Attributes:
        number: as given.
        reason: as given.
    """

    def __init__(self, number: int, reason: str) -> None:
        super().__init__(f"image {number}: {reason}")
        self.number = number
        self.reason = reason
