"""CTranslate2's Whisper as a reference, run in a process of its own.

CTranslate2's wheel carries Intel MKL, whose BLAS entry points a preloaded OpenBLAS (as the
`mlxcel` command and CI preload it) would replace inside CTranslate2 itself, which then
crashes. The reference runs in a child process without the preload; features go in and
results come back as `.npy` and JSON files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_WORKER = """
import json, sys
import ctranslate2, numpy as np
model_path, features_path, request_path, result_path = sys.argv[1:5]
request = json.load(open(request_path))
model = ctranslate2.models.Whisper(model_path, device="cpu", compute_type="float32")
features = np.load(features_path)
batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(features.T[None]))
if request["method"] == "generate":
    (result,) = model.generate(batch, [request["prompt"]], beam_size=1,
                               return_no_speech_prob=True)
    answer = {"tokens": result.sequences_ids[0], "no_speech_prob": result.no_speech_prob}
else:
    (aligned,) = model.align(batch, request["sot"], [request["text_tokens"]],
                             [request["num_frames"]], median_filter_width=7)
    answer = {"alignments": [list(pair) for pair in aligned.alignments]}
json.dump(answer, open(result_path, "w"))
"""


def _run(model_path: Path, features: np.ndarray, request: dict) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / name for name in ("features.npy", "request.json", "result.json")]
        np.save(paths[0], np.asarray(features, dtype=np.float32))
        paths[1].write_text(json.dumps(request))
        subprocess.run(
            [sys.executable, "-c", _WORKER, str(model_path), *map(str, paths)],
            env=environment,
            check=True,
        )
        return json.loads(paths[2].read_text())


def ctranslate2_generate(
    model_path: Path, features: np.ndarray, prompt: list[int]
) -> tuple[list[int], float]:
    """CTranslate2's greedy tokens and no-speech probability for one (frames, mels) window."""
    answer = _run(model_path, features, {"method": "generate", "prompt": prompt})
    return answer["tokens"], answer["no_speech_prob"]


def ctranslate2_align(
    model_path: Path, window: np.ndarray, sot: list[int], text_tokens: list[int], num_frames: int
) -> np.ndarray:
    """CTranslate2's (text token, frame) alignment pairs for one window, as an (N, 2) array."""
    request = {"method": "align", "sot": sot, "text_tokens": text_tokens, "num_frames": num_frames}
    return np.array(_run(model_path, window, request)["alignments"])
