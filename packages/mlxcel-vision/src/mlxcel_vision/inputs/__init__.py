"""Image inputs: an image reference (data URL, local path, http(s) URL) to a PIL image,
under the operator's media policy."""

from mlxcel_vision.inputs.errors import ImageInputError
from mlxcel_vision.inputs.policy import MediaPolicy
from mlxcel_vision.inputs.references import decode_image, read_image_file

__all__ = ["ImageInputError", "MediaPolicy", "decode_image", "read_image_file"]
