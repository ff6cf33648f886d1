"""Vision-language model families, one package each."""
