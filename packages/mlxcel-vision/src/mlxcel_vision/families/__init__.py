"""Vision-language model families, one package each, implementing `mlxcel_vision.family`."""
