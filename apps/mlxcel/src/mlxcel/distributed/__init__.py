"""`--tp`, `--pp` and `--disaggregate`: the group of ranks one command runs as, and how it stays
up when a rank fails."""
