"""`mlxcel generate` and `mlxcel run`: one prompt or a chat in the terminal, and a prompts file
on the batching engine."""
