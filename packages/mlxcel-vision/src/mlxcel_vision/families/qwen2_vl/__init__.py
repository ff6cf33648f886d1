"""Qwen2-VL and Qwen2.5-VL: dynamic-resolution vision tower, patch merger and a Qwen2
language model with multimodal RoPE."""

from mlxcel_vision.families.qwen2_vl.parts import load_parts

__all__ = ["load_parts"]
