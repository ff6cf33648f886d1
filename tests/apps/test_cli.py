"""`mlxcel generate` and `mlxcel bench` through `main(argv)`, on a tiny GGUF model."""

import io
import json
import re
import sys

import mlx.core as mx
import pytest

from mlxcel import cli
from mlxcel.cli import main, make_parser
from mlxcel.common import loading
from mlxcel.common.flags import UsageError, import_extra, resolve_defaults, sampling_params_from
from mlxcel.generation import batch_generate, generate_command
from mlxcel.generation.generate_command import FLAGS
from mlxcel_core.kernels import cpu_matvec
from mlxcel_models.store import StoreConfig

from factories import TinyConfig, write_gguf_model, write_safetensors_model


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, expected_code: int, message: str) -> None:
    assert code == expected_code
    assert err.startswith("mlxcel: error: ")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert message in err


def test_generate_streams_text_and_reports_timings(tiny_gguf):
    code, out, err = run_cli(
        "generate", "-m", str(tiny_gguf), "-p", "hello", "--temp", "0", "-n", "6"
    )
    assert code == 0
    assert out.endswith("\n")
    assert "prompt: " in err and " tokens/s" in err
    assert "generated: " in err and "peak memory: " in err and "load time: " in err
    assert "setup time: " in err
    assert "end of the context" not in err


def _weights_line(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.startswith("weights: ")]
    return line


def test_the_weights_line_says_what_each_gguf_tensor_type_became_in_memory(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "--temp", "0", "-n", "2")
    code, _, err = run_cli(*argv)
    assert code == 0
    # One sequence on the CPU with OpenBLAS keeps the file's quantization (docs/adr/0029).
    line = _weights_line(err)
    assert line.startswith(
        "weights: quantized, as in the file: Q8_0→8-bit g32 (15 tensors), F32 (5 tensors)"
    )
    if cpu_matvec.available():
        kernel = "; the SwiGLU activation of 2 MLPs on mlxcel's kernel from 16,384 values"
        assert line.endswith(kernel)
    assert "gguf:" not in err
    code, _, err = run_cli(*argv, environ={"MLXCEL_GGUF_DEQUANT": "bf16"})
    assert code == 0
    # Dequantized to bfloat16, then every float weight is cast to the CPU's float32.
    line = _weights_line(err)
    assert line.startswith("weights: dense float32: Q8_0→float32 (15 tensors), F32 (5 tensors)")
    if cpu_matvec.available():
        assert "; decode products of 2-32 rows on mlxcel's AVX2 kernel (built with " in line


def test_weights_made_dense_for_a_batch_are_said_to_be_dense(tiny_gguf, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\nthree\nfour\n")
    argv = ("generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "-n", "1")
    code, _, err = run_cli(*argv, "-np", "4", "--temp", "0")
    assert code == 0
    assert "weights: dense float32: Q8_0→float32 (15 tensors), F32 (5 tensors)" in err
    code, _, err = run_cli(*argv, "--gguf-dequant", "q4")
    assert_one_line_error(code, err, 2, "--gguf-dequant: invalid value 'q4' (expected one of")


def test_after_a_double_dash_a_word_with_a_dash_is_an_argument():
    code, _, err = run_cli("rm", "--", "-weird")
    assert code == 1 and "-weird is not a model id" in err


def test_a_known_short_flag_takes_its_number_attached(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0")
    assert run_cli(*argv, "-n3")[1] == run_cli(*argv, "-n", "3")[1]


def test_a_reply_cut_by_the_context_says_so(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0", "-c", "8")
    code, _, err = run_cli(*argv, "-n", "100")
    assert code == 0
    assert "the reply stopped at the end of the context; raise -c/--ctx-size" in err
    # A reply that -n ends just as it fills the context was cut by -n, not the context.
    prompt_tokens = int(err.split("prompt: ")[1].split(" tokens")[0])
    _, _, err = run_cli(*argv, "-n", str(8 - prompt_tokens))
    assert "end of the context" not in err


def test_a_chat_template_from_the_environment_leaves_raw_runs_alone(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "-n", "2")
    assert run_cli(*argv, environ={"LLAMA_ARG_CHAT_TEMPLATE": "chatml"})[0] == 0


def test_raw_and_chat_prompts_differ_in_length(tiny_gguf):
    _, _, chat_err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hello", "-n", "1")
    _, _, raw_err = run_cli("generate", "-m", str(tiny_gguf), "-p", "hello", "-n", "1", "-no-cnv")
    assert "prompt: 2 tokens" in raw_err
    assert "prompt: 2 tokens" not in chat_err


def test_greedy_runs_are_identical_and_seeded_runs_reproduce(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-n", "12", "-no-cnv")
    assert run_cli(*argv, "--temp", "0")[1] == run_cli(*argv, "--temp", "0")[1]
    assert (
        run_cli(*argv, "-s", "7", "--temp", "1.5")[1]
        == run_cli(*argv, "-s", "7", "--temp", "1.5")[1]
    )


def test_environment_mirror_applies_and_command_line_wins(tiny_gguf):
    argv = ("generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0")
    _, _, err = run_cli(*argv, environ={"LLAMA_ARG_N_PREDICT": "0"})
    assert "generated: 0 tokens" in err
    _, _, err = run_cli(*argv, "-n", "1", environ={"LLAMA_ARG_N_PREDICT": "0"})
    assert "generated: 1 tokens" in err


def test_model_from_environment(tiny_gguf):
    code, _, err = run_cli(
        "generate", "-p", "hi", "-n", "1", environ={"LLAMA_ARG_MODEL": str(tiny_gguf)}
    )
    assert code == 0 and "prompt: " in err


@pytest.mark.parametrize(
    ("argv", "environ", "code", "message"),
    [
        (("--top-p", "1.5"), {}, 2, "--top-p: top_p must be"),
        (("--temp", "hot"), {}, 2, "--temp: expected a number, got 'hot'"),
        ((), {"LLAMA_ARG_TOP_K": "many"}, 2, "LLAMA_ARG_TOP_K: expected an integer, got 'many'"),
        (("--seed", "abc"), {}, 2, "--seed: expected an integer, got 'abc'"),
        ((), {"LLAMA_ARG_CTX_SIZE": "x"}, 2, "LLAMA_ARG_CTX_SIZE: expected an integer, got 'x'"),
        (("--samplers", "top_k;magic"), {}, 2, "magic"),
        (("--repeat-last-n", "-5"), {}, 2, "repeat_last_n"),
        (("-n", "-3"), {}, 2, "-n/--n-predict"),
        (("--no-such-flag",), {}, 2, "unrecognized arguments"),
        # llama.cpp's flags mlxcel lacks, not read as a known short flag and its value.
        (("-hf", "owner/model"), {}, 2, "unrecognized arguments: -hf"),
        (("-dev", "CUDA0"), {}, 2, "unrecognized arguments: -dev"),
        (("-nocb",), {}, 2, "unrecognized arguments: -nocb"),
        (("--tem", "0.5"), {}, 2, "unrecognized arguments: --tem"),
        (("-c", "4"), {}, 1, "the context size is 4"),
        (("--block-size", "100000"), {}, 2, "--block-size must be <= 256, got 100000"),
        (("--chat-template", "nonsense"), {}, 2, "chatml"),
        (("--chat-template", "{{ 1 / 0 }}"), {}, 1, "chat template cannot render"),
        (("-sys", "be brief", "-no-cnv"), {}, 2, "-sys/--system-prompt needs the chat template"),
        (("--chat-template", "chatml", "-no-cnv"), {}, 2, "a chat template needs chat mode"),
        (("-p", "\udcff"), {}, 1, "not valid UTF-8"),
        (("-p", "", "-no-cnv"), {}, 1, "encodes to no tokens"),
    ],
)
def test_bad_input_gets_one_line_and_an_exit_code(tiny_gguf, argv, environ, code, message):
    result = run_cli("generate", "-m", str(tiny_gguf), "-p", "hello there", *argv, environ=environ)
    assert_one_line_error(result[0], result[2], code, message)


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        # Checked by the command (-b), by the sampler's settings (--top-p) and by the
        # engine's (--block-size): each refusal names the variable the value came from.
        ((), {"LLAMA_ARG_BATCH": "0"}, "LLAMA_ARG_BATCH must be >= 1, got 0"),
        ((), {"LLAMA_ARG_TOP_P": "1.5"}, "LLAMA_ARG_TOP_P: top_p must be"),
        ((), {"LLAMA_ARG_BLOCK_SIZE": "1000"}, "LLAMA_ARG_BLOCK_SIZE must be <= 256, got 1000"),
        # The command line wins, and is named when it does.
        (("-b", "-1"), {"LLAMA_ARG_BATCH": "0"}, "-b/--batch-size must be >= 1, got -1"),
        (("--top-p", "2"), {"LLAMA_ARG_TOP_P": "1.5"}, "--top-p: top_p must be"),
    ],
)
def test_a_value_out_of_range_is_named_as_the_user_gave_it(tiny_gguf, argv, environ, message):
    result = run_cli("generate", "-m", str(tiny_gguf), "-p", "hello there", *argv, environ=environ)
    assert_one_line_error(result[0], result[2], 2, message)
    assert f"mlxcel: error: {message}" in result[2]


def test_missing_prompt_and_prompt_file(tiny_gguf, tmp_path):
    code, _, err = run_cli("generate", "-m", str(tiny_gguf))
    assert_one_line_error(code, err, 2, "no prompt")
    code, _, err = run_cli("generate", "-m", str(tiny_gguf), "-f", str(tmp_path / "none.txt"))
    assert_one_line_error(code, err, 1, "cannot read prompt file")


def test_prompt_from_file(tiny_gguf, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "-f", str(prompt), "-n", "1", "-no-cnv"
    )
    assert code == 0 and "prompt: 2 tokens" in err


def test_bad_model_files(tiny_gguf, tmp_path):
    missing = tmp_path / "missing.gguf"
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:3000])
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("definitely not a model")
    unknown = write_gguf_model(tmp_path / "bloom.gguf", TinyConfig(architecture="bloom"), "F16")
    folder = tmp_path / "folder"
    folder.mkdir()
    missing_tensor = write_safetensors_model(tmp_path / "missing-tensor", TinyConfig())
    weights = mx.load(str(missing_tensor / "model.safetensors"))
    del weights["model.norm.weight"]
    mx.save_safetensors(str(missing_tensor / "model.safetensors"), weights)
    corrupt_weights = write_safetensors_model(tmp_path / "corrupt", TinyConfig())
    (corrupt_weights / "model.safetensors").write_bytes(b"\x00" * 64)
    bad_config = write_safetensors_model(tmp_path / "bad-config", TinyConfig())
    (bad_config / "config.json").write_text('{"model_type": "llama"}')
    for path, message in (
        (missing, "model not found"),
        (truncated, "corrupt or truncated"),
        (not_gguf, "neither a GGUF file nor a model folder"),
        (unknown, "unsupported GGUF architecture 'bloom'"),
        (folder, "holds no .safetensors"),
        (missing_tensor, "model.norm.weight"),
        (corrupt_weights, "corrupt"),
        (bad_config, "bad-config"),
    ):
        code, _, err = run_cli("generate", "-m", str(path), "-p", "hi")
        assert_one_line_error(code, err, 1, message)


def test_bench_prints_both_implementations_and_ratios(tiny_gguf):
    code, out, _ = run_cli(
        "bench", "-m", str(tiny_gguf), "-p", "16", "-n", "4", "-r", "1", "--compare"
    )
    assert code == 0
    assert "mlxcel" in out and "mlx-lm" in out
    assert "ratio mlxcel/mlx-lm: prompt" in out


def test_bench_rejects_bad_sizes(tiny_gguf):
    code, _, err = run_cli("bench", "-m", str(tiny_gguf), "-p", "0")
    assert_one_line_error(code, err, 2, "-p/--n-prompt must be >= 1")


def test_help_and_version_return_zero():
    assert run_cli("generate", "--help")[0] == 0
    assert run_cli("--version")[0] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU lines are Linux's")
def test_the_version_says_what_computes_the_cpu_kernels_work():
    lines = cli._version_text().splitlines()
    assert lines[2].startswith("quantized decode products on the CPU: ")
    assert lines[3].startswith("float32 decode products on the CPU: ")
    assert lines[4].startswith("SwiGLU activation on the CPU: ")
    assert lines[5].startswith("paged decode attention on the CPU: ")


def test_only_version_makes_the_version_text(monkeypatch, capsys):
    """The text imports MLX and may build the CPU kernels: no other command waits for it."""
    made = []
    monkeypatch.setattr(cli, "_version_text", lambda: made.append(1) or "mlxcel 9.9")
    make_parser("list").parse_args(["list"])
    assert made == []
    with pytest.raises(SystemExit) as exit_:
        make_parser().parse_args(["--version"])
    assert exit_.value.code == 0 and made == [1]
    assert capsys.readouterr().out == "mlxcel 9.9\n"


def test_repeatable_dry_breakers_from_flags_and_environment():
    def params(argv, environ):
        args = make_parser("generate").parse_args(["generate", *argv])
        resolve_defaults(args, FLAGS, environ)
        return sampling_params_from(args)

    given = ["--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "###"]
    assert params(given, {}).dry_sequence_breakers == ("\n", "###")
    from_env = params([], {"LLAMA_ARG_DRY_SEQUENCE_BREAKER": "END"})
    assert from_env.dry_sequence_breakers == ("END",)
    assert params(["--dry-sequence-breaker", "none"], {}).dry_sequence_breakers == ()
    assert params([], {}).dry_sequence_breakers == ("\n", ":", '"', "*")


def test_a_missing_extra_is_one_usage_line_naming_what_needed_it():
    with pytest.raises(UsageError) as refused:
        import_extra("mlxcel_no_such_extra", extra="fast", needed_by="--warp")
    assert str(refused.value) == (
        "--warp needs the fast extra: pip install 'mlxcel[fast]' "
        "(No module named 'mlxcel_no_such_extra')"
    )
    flags = import_extra("mlxcel.common.flags", extra="fast", needed_by="--warp")
    assert flags.import_extra is import_extra


def test_a_prompts_file_row_that_cannot_run_is_an_error_row_and_the_rest_run(tiny_gguf, tmp_path):
    prompts = tmp_path / "prompts.txt"
    # Prompts are numbered from 0 as the JSON rows' index; blank lines are no prompts.
    prompts.write_text("hello\n\n" + "word " * 200 + "\nbye\n")
    argv = ("generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "-n", "2")
    code, out, err = run_cli(*argv, "-c", "64", "-no-cnv", "--temp", "0")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2]
    assert rows[0]["completion_tokens"] == 2 and rows[2]["completion_tokens"] == 2
    assert set(rows[1]) == {"index", "prompt", "error"}
    assert re.match(r"the prompt has \d+ tokens but the context size is 64", rows[1]["error"])
    assert code == 1
    assert err.splitlines()[-1].startswith(
        "mlxcel: error: 1 of 3 prompts not generated (error rows); prompt 1: the prompt has"
    )


def test_a_ctrl_c_during_generate_prints_the_stats_of_what_was_generated(tiny_gguf):
    class InterruptedTerminal(io.StringIO):
        """Ctrl-C is pressed once, after the reply's first characters are shown."""

        pressed = False

        def write(self, text: str) -> int:
            if len(self.getvalue()) > 3 and not self.pressed:
                self.pressed = True
                raise KeyboardInterrupt
            return super().write(text)

    out, err = InterruptedTerminal(), io.StringIO()
    argv = ["generate", "-m", str(tiny_gguf), "-p", "hello", "-no-cnv", "--temp", "0"]
    code = main([*argv, "-n", "50"], environ={}, out=out, err=err)
    assert code == 130
    lines = err.getvalue().splitlines()
    generated = next(line for line in lines if line.startswith("generated: "))
    assert 1 <= int(generated.split()[1]) < 50
    assert lines[-1] == "mlxcel: interrupted"


def test_the_load_progress_bar_is_drawn_on_a_terminal_only(tiny_gguf, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(loading, "PROGRESS_DELAY_SECONDS", 0.0)
    for stream, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        store = StoreConfig(models_dir=tiny_gguf.parent, hf_cache_dir=tiny_gguf.parent)
        loading.load_for_command(str(tiny_gguf), store=store)
        assert ("loading" in stream.getvalue()) is drawn


def test_generate_sets_aside_one_sequence_for_one_prompt_and_at_most_np_for_a_file(
    tiny_gguf, tmp_path, monkeypatch
):
    """-np applies only with --prompts-file: one prompt's engine keeps residual blocks and
    recurrent state for one sequence, a file's for at most -np and at most its prompts."""
    seen = []

    def open_engine(args, loaded, config, **kwargs):
        seen.append(config.scheduler.max_num_seqs)
        return real_open_engine(args, loaded, config, **kwargs)

    real_open_engine = generate_command.open_engine
    monkeypatch.setattr(generate_command, "open_engine", open_engine)
    monkeypatch.setattr(batch_generate, "open_engine", open_engine)
    argv = ("generate", "-m", str(tiny_gguf), "-n", "2", "--temp", "0", "-c", "64")
    assert run_cli(*argv, "-p", "hello", "-no-cnv")[0] == 0
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nthere\nbye\n")
    assert run_cli(*argv, "--prompts-file", str(prompts))[0] == 0
    assert run_cli(*argv, "--prompts-file", str(prompts), "-np", "2")[0] == 0
    assert seen == [1, 3, 2]
    code, _, err = run_cli(*argv, "-p", "hello", "-no-cnv", "-np", "0")
    assert_one_line_error(code, err, 2, "-np/--parallel must be >= 1, got 0")


def test_a_failed_runs_advice_names_the_variable_the_value_came_from(tiny_gguf):
    code, _, err = run_cli(
        "generate", "-m", str(tiny_gguf), "-p", "hello there", "-c", "256", "-ctk", "turbo4",
        "--gpu-memory-utilization", "0.000001", "--no-memory-check",
        environ={"LLAMA_ARG_CACHE_RESIDUAL": "64"},
    )  # fmt: skip
    assert code == 1
    assert "lower LLAMA_ARG_CACHE_RESIDUAL or -np/--parallel" in err
    assert "--cache-residual" not in err
