"""`mlxcel serve` (and `mlxcel-server`): the server's flags, settings and access log."""
