"""`mlxcel list`, `rm`, `arch` and `inspect`: the model store and what a model needs."""
