"""mlxcel server: the OpenAI-compatible HTTP API as a Quart app (not built yet)."""
