"""End to end on the real SmolLM2-135M-Instruct GGUF (98 MB, CPU): answers and mlx-lm parity."""

import io
import shlex
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxcel.cli import main
from mlxcel_core.engine.memory import measure_pass, profile_model
from mlxcel_core.generate import generate_tokens
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

pytestmark = pytest.mark.slow

NUM_TOKENS = 48


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return load_model(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_as_stored(smollm2_path):
    """The model with the file's dtypes and MLX's quantized kernels only, as mlx-lm runs it."""
    return load_model(smollm2_path, compute=ComputeOptions())


def readme_first_command() -> list[str]:
    """The `mlxcel ...` part of the README's first command (after `uv run`)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1]
    first_line = block.splitlines()[0]
    return shlex.split(first_line.split(" uv run ", 1)[1])


def test_the_readme_first_command_answers_paris():
    command = readme_first_command()
    assert command[:2] == ["mlxcel", "generate"]
    result = subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "The capital of France is Paris."


@pytest.mark.parametrize(
    ("prompt", "chat"),
    [
        ("Write a haiku about the sea.", True),
        ("def fibonacci(n):", False),
    ],
)
def test_greedy_tokens_equal_mlx_lm(smollm2, smollm2_as_stored, prompt, chat):
    tokenizer = smollm2.tokenizer
    if chat:
        tokens = tokenizer.encode_chat([{"role": "user", "content": prompt}])
    else:
        tokens = tokenizer.encode(prompt)
    sampler = Sampler(SamplingParams(temperature=0.0))
    ours = []
    for token in generate_tokens(smollm2.model, tokens, sampler, prefill_step_size=16):
        ours.append(token)
        if len(ours) == NUM_TOKENS:
            break
    theirs = [
        int(token)
        for token, _ in generate_step(
            mx.array(tokens),
            smollm2_as_stored.model.module,
            max_tokens=NUM_TOKENS,
            sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
        )
    ]
    assert ours == theirs


def test_chat_prompt_renders_chatml_with_the_default_system_message(smollm2):
    text = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_n_predict_caps_the_answer(smollm2):
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["generate", "-p", "What is the capital of France? Answer in one sentence.",
         "--temp", "0", "-n", "3"],
        environ={},
        out=out,
        err=err,
    )  # fmt: skip
    assert code == 0
    assert out.getvalue().strip() == "The capital of"


def test_the_step_scaled_from_small_passes_covers_a_measured_chunk(smollm2):
    model = smollm2.model
    scaled = profile_model(model, 512).transient_bytes
    measured = measure_pass(model, 512).transient_bytes
    assert measured <= scaled <= 2.5 * measured
