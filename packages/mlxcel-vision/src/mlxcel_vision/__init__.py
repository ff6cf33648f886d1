"""mlxcel vision: vision-language model inputs, encoders and connectors (not built yet)."""
