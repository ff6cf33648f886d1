"""Vision-language model families, one package each, each exposing `load_parts`."""
