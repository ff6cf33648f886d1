"""`mlxcel bench` and `mlxcel tune`: speed measured, and the fastest settings searched and
stored."""
