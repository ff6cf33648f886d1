"""LLaVA (`llava`) and LLaVA-NeXT (`llava_next`): CLIP vision tower, MLP projector, an
mlx-lm text model."""

from mlxcel_vision.families.llava.loading import load_parts

__all__ = ["load_parts"]
