"""mlxcel's errors share one base, and a parameter out of range names itself."""

import ast
import math
from pathlib import Path

import pytest

from mlxcel_core.errors import InputError, MlxcelError, ParamError
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams, parse_sampler_order

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: SamplingParams(temperature=math.nan), "temperature"),
        (lambda: SamplingParams(top_p=1.5), "top_p"),
        (lambda: SamplingParams(logit_bias={-1: 1.0}), "logit_bias"),
        (lambda: SamplingParams(logit_bias={3: math.nan}), "logit_bias"),
        (lambda: SamplingParams(seed=-5), "seed"),
        (lambda: parse_sampler_order("top_k;nonsense"), "samplers"),
        (lambda: GenerationConfig(context_size=0), "context_size"),
        (lambda: GenerationConfig(context_size=8, max_tokens=-2), "max_tokens"),
        (lambda: GenerationConfig(context_size=8, max_predict_seconds=0.0), "max_predict_seconds"),
    ],
)
def test_a_value_out_of_range_raises_a_param_error_naming_the_parameter(make, param):
    with pytest.raises(ParamError) as caught:
        make()
    assert caught.value.param == param
    assert str(caught.value).startswith(param)
    assert isinstance(caught.value, ValueError | InputError | MlxcelError)


def _error_classes() -> list[tuple[str, list[str]]]:
    """(class name, its base names) for every `*Error` class in the packages and the app."""
    found = []
    for source in [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("apps/*/src/**/*.py")]:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                found.append((node.name, [ast.unparse(base) for base in node.bases]))
    return found


def test_every_mlxcel_error_derives_from_the_common_base():
    classes = dict(_error_classes())
    assert len(classes) > 20

    def derives(name: str) -> bool:
        if name in ("MlxcelError", "InputError"):
            return True
        return any(derives(base) for base in classes.get(name, []) if base in classes)

    assert not [name for name in classes if not derives(name)]
