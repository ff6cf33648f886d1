"""`mlxcel speak` through `main`, with the real en_US-joe-medium voice."""

from __future__ import annotations

import io

import soundfile

from mlxcel.cli import main


def _run(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, io.TextIOWrapper, str]:
    out = io.TextIOWrapper(io.BytesIO())
    err = io.StringIO()
    code = main(["speak", *argv], environ=environ or {}, out=out, err=err)
    return code, out, err.getvalue()


def test_writes_a_wav_file_and_reports_the_real_time_factor(tmp_path):
    path = tmp_path / "hello.wav"
    code, _, err = _run("Hello there.", "-o", str(path), "--seed", "1")

    assert code == 0
    samples, rate = soundfile.read(path)
    assert rate == 22_050 and samples.size > rate // 4
    assert f"of wav audio to {path}" in err and "real-time factor" in err


def test_reads_the_text_from_a_file_and_takes_the_format_from_the_suffix(tmp_path):
    (tmp_path / "text.txt").write_text("Good morning.", encoding="utf-8")
    path = tmp_path / "speech.mp3"
    code, _, _ = _run("-f", str(tmp_path / "text.txt"), "-o", str(path), "--speed", "1.5")

    assert code == 0
    info = soundfile.info(path)
    assert info.format == "MP3" and info.samplerate == 22_050 and info.frames > 0


def test_streams_pcm_to_stdout():
    code, out, err = _run("Yes. No.", "-o", "-", "--response-format", "pcm")

    out.flush()
    data = out.buffer.getvalue()
    assert code == 0 and len(data) > 0 and len(data) % 2 == 0
    assert "to stdout" in err


def test_usage_errors_exit_2_with_one_line(tmp_path):
    cases = [
        (),
        ("Hi.", "-f", str(tmp_path / "t.txt")),
        ("Hi.", "-o", str(tmp_path / "out.xyz")),
        ("Hi.", "--response-format", "ogg"),
    ]
    for argv in cases:
        code, _, err = _run(*argv)
        assert code == 2 and err.count("\n") == 1 and err.startswith("mlxcel: error:"), argv


def test_input_errors_exit_1_with_one_line(tmp_path):
    out_wav = str(tmp_path / "out.wav")
    cases = [
        (("Hi.", "-o", out_wav, "--speed", "9"), "speed must be in [0.25, 4.0], got 9.0"),
        (("Hi.", "-o", out_wav, "-s", str(2**64)), "seed must be in [0, 2**64)"),
        (("Hi.", "-o", out_wav, "--voice", "narrator"), "--voice 'narrator': no such voice file"),
        (("Hi.", "-o", out_wav, "--voice", str(tmp_path / "absent.onnx")), "no voice file"),
        (("-f", str(tmp_path / "absent.txt"), "-o", out_wav), "cannot read"),
        (("   ", "-o", out_wav), "empty"),
    ]
    for argv, message in cases:
        code, _, err = _run(*argv)
        assert code == 1 and err.count("\n") == 1 and message in err, (argv, err)
    assert not (tmp_path / "out.wav").exists()


def test_environment_mirrors_are_read():
    code, _, err = _run("Hi.", environ={"MLXCEL_SPEED": "fast"})
    assert code == 2 and "MLXCEL_SPEED" in err
