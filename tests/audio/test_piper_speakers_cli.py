"""`mlxcel speak --speaker` through `main`, with the small multi-speaker test voice."""

from __future__ import annotations

import io
from pathlib import Path

from mlxcel.cli import main

VOICE = str(Path(__file__).parent / "data" / "multi-speaker.onnx")


def _speak(tmp_path: Path, *argv: str, environ: dict[str, str] | None = None):
    """(exit code, stderr, the wav's bytes or None) of speaking "Hello there." once."""
    path = tmp_path / "speech.wav"
    path.unlink(missing_ok=True)
    err = io.StringIO()
    code = main(
        ["speak", "Hello there.", "-o", str(path), "--seed", "1", *argv],
        environ=environ or {},
        out=io.TextIOWrapper(io.BytesIO()),
        err=err,
    )
    return code, err.getvalue(), path.read_bytes() if path.exists() else None


def test_a_speaker_is_picked_by_name_id_or_environment(tmp_path):
    _, _, bob = _speak(tmp_path, "--voice", VOICE, "--speaker", "bob")
    _, _, one = _speak(tmp_path, "--voice", VOICE, "--speaker", "1")
    _, _, mirrored = _speak(tmp_path, "--voice", VOICE, environ={"MLXCEL_SPEAKER": "bob"})
    _, _, ann = _speak(tmp_path, "--voice", VOICE, "--speaker", "ann")
    _, _, default = _speak(tmp_path, "--voice", VOICE)

    assert bob is not None and bob == one == mirrored
    assert ann != bob and default == ann


def test_an_unknown_speaker_exits_1_with_one_line(tmp_path):
    code, err, written = _speak(tmp_path, "--voice", VOICE, "--speaker", "dan")

    assert code == 1 and err.count("\n") == 1 and written is None
    assert "unknown speaker 'dan'; this voice's speakers: ann, bob, cid or an id below 3" in err


def test_a_speaker_in_both_voice_and_speaker_is_a_usage_error(tmp_path):
    code, err, _ = _speak(tmp_path, "--voice", "narrator", "--speaker", "bob")

    assert code == 2 and err.count("\n") == 1 and "--speaker" in err
