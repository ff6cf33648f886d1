"""mlxcel audio: speech-to-text and text-to-speech on MLX (not built yet)."""
