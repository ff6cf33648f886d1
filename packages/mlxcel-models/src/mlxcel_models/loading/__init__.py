"""Model loaders: GGUF files and Hugging Face / mlx-lm safetensors folders."""
