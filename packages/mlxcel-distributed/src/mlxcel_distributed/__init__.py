"""mlxcel distributed: tensor and pipeline parallel inference on mx.distributed (not built yet)."""
