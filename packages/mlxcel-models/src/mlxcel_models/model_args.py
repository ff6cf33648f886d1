"""mlx-lm's `ModelArgs` built from a text config, its mistakes named by key.

mlx-lm builds a family's `ModelArgs` dataclass from the config's keys (`from_dict` keeps
the ones the dataclass declares) and trusts their values: a missing required key is the
constructor's TypeError, a string where a number belongs fails deep in the model's code,
and more experts per token than experts fails in MLX's argpartition at the first forward
pass. Here the dataclass's fields are read first (their defaults and annotations), so a
config is refused in one line naming the key, its value and the file.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlx_lm.models.base import BaseModelArgs
from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.dimensions import check_config_dimensions, positive_int

# Fields that, when a family declares them and the config gives a value, count positions
# or layers: zero or less describes no model.
_POSITIVE_FIELDS = ("sliding_window",)
# (experts per token, the keys a family names its expert count with).
_EXPERT_COUNTS = (
    ("num_experts_per_tok", ("num_experts", "num_local_experts", "n_routed_experts",
                             "moe_num_experts")),
    ("num_experts_per_token", ("num_experts", "num_local_experts")),
)  # fmt: skip
# Fields a family annotates as one value but also reads as a list, one per layer (Step 3.5's
# RoPE bases, which mlx-lm indexes by layer), by mlx-lm module.
_PER_LAYER_LISTS = {"step3p5": frozenset({"rope_theta"})}
# What a value of each annotated type is called in a message.
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list", tuple: "a list", dict: "an object"}  # fmt: skip
_MISSING_ARGUMENT = re.compile(
    r"missing \d+ required (?:positional|keyword-only) arguments?: '(\w+)'"
)


def mlx_lm_module_name(config: Mapping[str, Any]) -> str:
    """The `mlx_lm.models` module that runs `config`, mapped as mlx-lm's loader maps it
    (`MODEL_ARCHITECTURE_REMAPPING` by the config's `architectures`, else `MODEL_REMAPPING`)."""
    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    for architecture in (architectures,) if isinstance(architectures, str) else architectures:
        remapped = MODEL_ARCHITECTURE_REMAPPING.get((model_type, architecture))
        if remapped is not None:
            return remapped
    return MODEL_REMAPPING.get(model_type, model_type)


def make_model_args(config: Mapping[str, Any], *, where: str | Path) -> Any:
    """The family's `ModelArgs` for `config`, as mlx-lm's `from_dict` builds it, after
    `check_model_args`.

    Raises:
        ModuleNotFoundError: mlx-lm has no module for the model type.
        ModelLoadError: as `check_model_args`, or `ModelArgs` refuses a value.
    """
    args_class = check_model_args(config, where=where)
    try:
        return args_class.from_dict(dict(config))
    except (TypeError, ValueError) as error:
        raise config_error(error, where) from error


def check_model_args(config: Mapping[str, Any], *, where: str | Path) -> type:
    """Refuse a config the family's `ModelArgs` cannot take; return that class.

    Checked: the counts and sizes (`check_config_dimensions`), every field without a
    default is given, each value given has its field's annotated type (an integer for
    `int`, any number for `float`, a list for `list[...]`, ...; null is taken where the
    field has a default, which the family's code then replaces), and no more experts
    per token than experts, and a positive sliding window where the family has one.

    Args:
        config: the text config (config.json, or made from GGUF metadata).
        where: the file it came from, for the message.

    Raises:
        ModuleNotFoundError: mlx-lm has no module for the model type.
        ModelLoadError: naming `where`, the key and the value.
    """
    check_config_dimensions(config, where)
    _check_expert_counts(config, where)
    args_class = family_module(config, where=where).ModelArgs
    # A family with its own from_dict (a nested text_config) is checked by its constructor.
    if args_class.from_dict.__func__ is not BaseModelArgs.from_dict.__func__:
        return args_class
    fields = {field.name: field for field in dataclasses.fields(args_class) if field.init}
    for name, field in fields.items():
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        if name not in config and not has_default:
            raise ModelLoadError(f"{where} lacks a hyperparameter: '{name}'")
    for name in _POSITIVE_FIELDS:
        if name in fields and config.get(name) is not None:
            positive_int(config[name], name, where)
    hints = _type_hints(args_class)
    per_layer_lists = _PER_LAYER_LISTS.get(mlx_lm_module_name(config), frozenset())
    for name, value in config.items():
        if name not in fields or name not in hints:
            continue
        # Null stands for "the default" in Hugging Face configs; the family's code decides.
        if value is None:
            continue
        if name in per_layer_lists and isinstance(value, list):
            continue
        expected = _expected_type(value, hints[name])
        if expected is not None:
            raise ModelLoadError(f"{where}: {name} must be {expected}, got {value!r}")
    return args_class


def family_module(config: Mapping[str, Any], *, where: str | Path) -> types.ModuleType:
    """The `mlx_lm.models` module that runs `config` (`mlx_lm_module_name`).

    Raises:
        ModuleNotFoundError: mlx-lm has no module for the model type.
        ModelLoadError: the module needs a package that is not installed.
    """
    name = mlx_lm_module_name(config)
    try:
        return importlib.import_module(f"mlx_lm.models.{name}")
    # mlx-lm's olmo module exits the interpreter when its optional package is missing.
    except SystemExit as error:
        raise ModelLoadError(
            f"{where}: mlx-lm's {name} module needs a package that is not installed "
            "(for olmo: pip install ai2-olmo)"
        ) from error


def config_error(error: TypeError | ValueError, where: str | Path) -> ModelLoadError:
    """A `ModelArgs` or model constructor's error on a config, as a one-line load error;
    a missing argument is named as the key the config lacks."""
    missing = _MISSING_ARGUMENT.search(str(error))
    if missing is not None:
        return ModelLoadError(f"{where} lacks a hyperparameter: '{missing[1]}'")
    return ModelLoadError(f"{where}: {error}")


def _check_expert_counts(config: Mapping[str, Any], where: str | Path) -> None:
    for per_token_key, count_keys in _EXPERT_COUNTS:
        per_token = config.get(per_token_key)
        count_key = next((key for key in count_keys if config.get(key) is not None), None)
        if not _is_int(per_token) or count_key is None or not _is_int(config[count_key]):
            continue
        if not 0 < per_token <= config[count_key]:
            raise ModelLoadError(
                f"{where}: {per_token_key} must be between 1 and {count_key} "
                f"({config[count_key]}), got {per_token}"
            )


def _type_hints(args_class: type) -> dict[str, Any]:
    """The dataclass's resolved annotations; none where one names a type that cannot be
    resolved (then nothing is checked against them)."""
    try:
        return typing.get_type_hints(args_class)
    except (NameError, TypeError):
        return {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expected_type(value: Any, annotation: Any) -> str | None:
    """What `value` should be under `annotation`, or None when it is that (or the
    annotation is not one checked: a class of the family's own, `Any`)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(annotation)
        names = [_expected_type(value, member) for member in members]
        if any(name is None for name in names):
            return None
        return " or ".join(dict.fromkeys(name for name in names if name))
    if origin is typing.Literal:
        allowed = typing.get_args(annotation)
        return None if value in allowed else "one of " + ", ".join(map(repr, allowed))
    base = origin or annotation
    if annotation is type(None):
        return None if value is None else "null"
    if base not in _TYPE_NAMES:
        return None
    return None if _has_type(value, base) else _TYPE_NAMES[base]


def _has_type(value: Any, base: type) -> bool:
    """Whether `value` passes for `base`, leniently where mlx-lm's annotations are loose:
    any number for `int` (some fields annotated `int` hold fractions, and configs write
    whole numbers as 2048.0), a string for `list` (a layer pattern such as "M*-")."""
    if base in (int, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base is bool:
        return isinstance(value, bool) or value in (0, 1)
    if base in (list, tuple):
        return isinstance(value, list | tuple | str)
    return isinstance(value, base)
