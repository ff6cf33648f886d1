"""Load-time model surgery: reproducible weight edits from a YAML file (docs/surgery.md)."""

from mlxcel_models.surgery.apply import CheckpointReader, EffectiveEdit, apply_surgery
from mlxcel_models.surgery.errors import SurgeryError
from mlxcel_models.surgery.parse import parse_surgery, read_surgery_file
from mlxcel_models.surgery.plan import SurgeryPlan

__all__ = [
    "CheckpointReader",
    "EffectiveEdit",
    "SurgeryError",
    "SurgeryPlan",
    "apply_surgery",
    "parse_surgery",
    "read_surgery_file",
]
