"""mlxcel audio: speech-to-text (Whisper) and text-to-speech (Piper voices) on MLX."""
