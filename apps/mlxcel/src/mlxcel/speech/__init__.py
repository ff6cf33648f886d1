"""`mlxcel transcribe` and `mlxcel speak`, and the speech models `mlxcel serve` loads."""
