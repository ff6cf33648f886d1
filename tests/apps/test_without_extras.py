"""`mlxcel generate` and `mlxcel serve` work without the audio and vision extras, and a flag or
command that needs a missing extra names it.

Each case runs in a fresh interpreter where the extras' packages (and the libraries only they
bring) cannot be imported, as after `pip install mlxcel` without `[audio]` or `[vision]`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

ABSENT = ("mlxcel_audio", "mlxcel_vision", "PIL", "soundfile", "soxr", "av", "onnxruntime")


def run_without_extras(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT)
    script = f"import sys\n{blocked}{textwrap.dedent(code)}"
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300
    )


def test_generate_runs_and_image_flags_ask_for_the_vision_extra(tiny_gguf, tmp_path):
    image = tmp_path / "red.png"
    image.write_bytes(b"not read")
    done = run_without_extras(
        """
        import io
        from mlxcel.cli import main
        model, image = sys.argv[1:]
        out, err = io.StringIO(), io.StringIO()
        code = main(["generate", "-m", model, "-n", "4", "--temp", "0", "-p", "Hi"],
                    environ={}, out=out, err=err)
        assert code == 0, err.getvalue()
        assert out.getvalue(), "no text generated"
        for flags in (["--image", image], ["--media-max-bytes", "100"]):
            err = io.StringIO()
            code = main(["generate", "-m", model, "-n", "4", "-p", "Hi", *flags],
                        environ={}, out=io.StringIO(), err=err)
            print(code, err.getvalue(), end="")
        """,
        str(tiny_gguf),
        str(image),
    )
    assert done.returncode == 0, done.stderr
    refusals = done.stdout.splitlines()
    assert len(refusals) == 2
    for refusal, flag in zip(refusals, ("--image", "--media-max-bytes"), strict=True):
        assert refusal.startswith(
            f"2 mlxcel: error: {flag} needs the vision extra: pip install 'mlxcel[vision]' ("
        )


def test_serve_reads_no_images_and_serves_no_speech_but_refuses_their_flags(tmp_path):
    done = run_without_extras(
        """
        from mlxcel.speech.audio_flags import SpeechModelPaths, speech_model_paths
        from mlxcel.cli import make_parser
        from mlxcel.common.flags import UsageError, resolve_defaults
        from mlxcel.serving.serve_command import FLAGS, settings_from

        def parsed(*argv):
            args = make_parser("serve").parse_args(["serve", *argv])
            resolve_defaults(args, FLAGS, {})
            return args

        assert settings_from(parsed()).image_decoder is None
        assert speech_model_paths(parsed()) == SpeechModelPaths(None, None)
        for refused in (lambda: settings_from(parsed("--media-fetch")),
                        lambda: speech_model_paths(parsed("--stt-model", sys.argv[1]))):
            try:
                refused()
            except UsageError as error:
                print(error)
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    refusals = done.stdout.splitlines()
    assert refusals[0].startswith(
        "--media-fetch needs the vision extra: pip install 'mlxcel[vision]' ("
    )
    assert refusals[1].startswith(
        "serving speech models needs the audio extra: pip install 'mlxcel[audio]' ("
    )


def test_the_speech_commands_name_the_audio_extra():
    done = run_without_extras(
        """
        import io
        from mlxcel.cli import main
        for command in ("speak", "transcribe"):
            err = io.StringIO()
            code = main([command, "--help"], environ={}, out=io.StringIO(), err=err)
            print(code, err.getvalue(), end="")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"2 mlxcel: error: mlxcel {command} needs the audio extra: pip install 'mlxcel[audio]'"
        for command in ("speak", "transcribe")
    ]
