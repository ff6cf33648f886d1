"""`mlxcel generate` and `mlxcel serve` work without the audio and vision extras.

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
        err = io.StringIO()
        code = main(["generate", "-m", model, "-n", "4", "-p", "Hi", "--image", image],
                    environ={}, out=io.StringIO(), err=err)
        print(code, err.getvalue(), end="")
        """,
        str(tiny_gguf),
        str(image),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "2 mlxcel: error: --image needs the vision extra: pip install 'mlxcel[vision]'\n"
    )


def test_serve_reads_no_images_and_serves_no_speech_but_refuses_a_named_speech_model(tmp_path):
    done = run_without_extras(
        """
        from mlxcel.audio_flags import SpeechModelPaths, speech_model_paths
        from mlxcel.cli import make_parser
        from mlxcel.flags import UsageError, resolve_defaults
        from mlxcel.serve_command import FLAGS, settings_from

        def parsed(*argv):
            args = make_parser("serve").parse_args(["serve", *argv])
            resolve_defaults(args, FLAGS, {})
            return args

        assert settings_from(parsed("--media-fetch")).image_decoder is None
        assert speech_model_paths(parsed()) == SpeechModelPaths(None, None)
        try:
            speech_model_paths(parsed("--stt-model", sys.argv[1]))
        except UsageError as error:
            print(error)
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("speech models need the audio extra: pip install 'mlxcel[audio]'")
