"""The Idefics3 family (SmolVLM, Idefics3): SigLIP tiles, pixel-shuffle connector, llama."""

from mlxcel_vision.families.idefics3.load import load_parts

__all__ = ["load_parts"]
