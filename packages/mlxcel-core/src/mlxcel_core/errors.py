"""The bases of mlxcel's own errors, so that a caller can tell what it asked for wrong from
a fault, and catch either in one clause.

`MlxcelError` is the base of every error mlxcel raises on purpose. `InputError` marks what
the caller gave: a parameter out of range, a prompt that does not fit, a file that is not a
model; its message says what is wrong and how to fix it. `ParamError` is the input error of
one named parameter. Input errors that were `ValueError`s stay `ValueError`s too, so code
catching a `ValueError` from a lower layer (a model file's, MLX's) still catches them and
nothing else changes class.
"""

from __future__ import annotations


class MlxcelError(Exception):
    """Base of the errors mlxcel raises on purpose (not a bug)."""


class InputError(MlxcelError):
    """What the caller gave cannot be used as it is; the message says why."""


class ParamError(InputError, ValueError):
    """A parameter's value is outside its allowed range.

    Attributes:
        param: the parameter's name as the settings spell it (`temperature`, `max_tokens`),
            so a caller can name its own spelling of it (a flag, an API field).
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
