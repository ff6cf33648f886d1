"""Vision encoder images/s and time to first token of an image request: mlxcel against
mlx-vlm on the same random-weight LLaVA folders, in one run.

For each image size, `random_vlm.py` writes (once, under `--work-dir`) a LLaVA 1.5 folder
whose CLIP tower has a real checkpoint's shape at that input size. Both runtimes load it:
mlxcel in this process, mlx-vlm in a subprocess started with `--mlx-vlm-python` (an
interpreter of an environment holding mlx-vlm, which never enters mlxcel's dependencies;
benchmarks/vlm_bench_mlx_vlm.py is its side). Two figures per size and runtime:

- encoder images/s: one preprocessed image (batch 1) through the vision tower, feature
  selection and projector, evaluated; preprocessing is not timed;
- TTFT: from the image file to the first generated token (greedy) of a one-image chat
  request: mlxcel's prompter and continuous-batching engine (one request), mlx-vlm's
  `stream_generate`. Each request has an image never seen before, so no cache of encoder
  outputs or prompt prefixes helps either side.

After one warm-up of each, the two sides' runs alternate (the first to go swaps every
round) so that load from other jobs on the machine falls on both; the table gives the
median and the range of `--repeats` runs. Run it with OpenBLAS, which both sides inherit:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        uv run python benchmarks/vlm_bench.py --mlx-vlm-python /tmp/vlmvenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image
from random_vlm import VISION_TOWERS, write_random_llava

from mlxcel_core.engine import Engine, EngineConfig, EngineRequest, OutputQueue
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_vision.loading import load_vision_model

PROMPT = "Describe the image."
# The pictures' size before each processor resizes and crops them to the tower's.
PICTURE_HEIGHT, PICTURE_WIDTH = 480, 640
CONTEXT_SIZE = 4096
BLOCK_SIZE = 16
OUTPUT_TIMEOUT_SECONDS = 600.0
WORKER = Path(__file__).with_name("vlm_bench_mlx_vlm.py")


class MlxcelSide:
    """mlxcel on one folder: its encoder, and its engine serving one request at a time."""

    name = "mlxcel"

    def __init__(self, folder: Path) -> None:
        self._loaded = load_vision_model(folder)
        self._parts = self._loaded.model.parts
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}
        ]
        self._chat = self._loaded.tokenizer.apply_chat_template(messages)
        config = EngineConfig(
            context_size=CONTEXT_SIZE,
            block_size=BLOCK_SIZE,
            num_kv_blocks=CONTEXT_SIZE // BLOCK_SIZE + 1,
        )
        self._engine = Engine(self._loaded.model, config)

    def encode_seconds(self, picture: Path) -> float:
        """Wall seconds of one preprocessed image through the tower and projector."""
        prepared = self._parts.processor.prepare(Image.open(picture))
        start = time.perf_counter()
        mx.eval(self._parts.encoder(prepared.runs[0].inputs))
        return time.perf_counter() - start

    def ttft(self, picture: Path) -> tuple[float, int]:
        """(wall seconds from the image file to the first token, prompt tokens)."""
        start = time.perf_counter()
        prompt = self._loaded.image_prompter.encode(self._chat, [Image.open(picture)])
        request = EngineRequest(
            prompt_ids=prompt.prompt_ids,
            sampling=SamplingParams(temperature=0.0),
            generation=GenerationConfig(context_size=CONTEXT_SIZE, max_tokens=1),
            detokenizer=self._loaded.tokenizer.make_detokenizer(),
            images=prompt.images,
        )
        sink = OutputQueue()
        self._engine.submit([request], sink)
        while True:
            output = sink.get(timeout=OUTPUT_TIMEOUT_SECONDS)
            if output.error is not None:
                raise RuntimeError(f"mlxcel's engine failed the request: {output.error}")
            if output.token_id is not None:
                seconds = time.perf_counter() - start
                break
        while not output.finished:
            output = sink.get(timeout=OUTPUT_TIMEOUT_SECONDS)
        return seconds, len(prompt.prompt_ids)

    def close(self) -> None:
        self._engine.shutdown(timeout=OUTPUT_TIMEOUT_SECONDS)


class MlxVlmSide:
    """mlx-vlm on one folder, in a subprocess of its own interpreter."""

    name = "mlx-vlm"

    def __init__(self, python: Path, folder: Path) -> None:
        self._process = subprocess.Popen(
            [str(python), str(WORKER), str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()

    def _read(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"mlx-vlm's side exited with status {self._process.wait()}")
        return json.loads(line)

    def _ask(self, op: str, picture: Path) -> dict:
        self._process.stdin.write(json.dumps({"op": op, "image": str(picture)}) + "\n")
        self._process.stdin.flush()
        return self._read()

    def encode_seconds(self, picture: Path) -> float:
        return self._ask("encode", picture)["seconds"]

    def ttft(self, picture: Path) -> tuple[float, int]:
        answer = self._ask("ttft", picture)
        return answer["seconds"], answer["prompt_tokens"]

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait()


@dataclass
class Samples:
    """One side's measurements at one image size."""

    encode_seconds: list[float]
    ttft_seconds: list[float]
    prompt_tokens: int = 0


def write_pictures(folder: Path, count: int) -> list[Path]:
    """`count` distinct random RGB pictures as PNG files (seeded)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(count):
        path = folder / f"picture-{seed}.png"
        if not path.exists():
            pixels = np.random.default_rng(seed).integers(
                0, 256, (PICTURE_HEIGHT, PICTURE_WIDTH, 3), np.uint8
            )
            Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def measure(sides: list, pictures: list[Path]) -> dict[str, Samples]:
    """Warm each side up on the first picture, then alternate the sides on the others,
    one picture per round for both figures."""
    samples = {side.name: Samples([], []) for side in sides}
    for side in sides:
        side.encode_seconds(pictures[0])
        side.ttft(pictures[0])
    for round_number, picture in enumerate(pictures[1:]):
        order = sides if round_number % 2 == 0 else sides[::-1]
        for side in order:
            samples[side.name].encode_seconds.append(side.encode_seconds(picture))
        for side in order:
            seconds, prompt_tokens = side.ttft(picture)
            samples[side.name].ttft_seconds.append(seconds)
            samples[side.name].prompt_tokens = prompt_tokens
        print(f"  round {round_number + 1}/{len(pictures) - 1} done", file=sys.stderr)
    return samples


def spread(values: list[float]) -> str:
    """'median (min-max)' with three significant figures."""
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def table_rows(size: int, samples: dict[str, Samples]) -> list[str]:
    """Markdown rows: per side, images/s and TTFT; then mlxcel / mlx-vlm."""
    rows = []
    for name, sample in samples.items():
        rates = [1.0 / seconds for seconds in sample.encode_seconds]
        rows.append(
            f"| {size}² | {name} | {spread(rates)} | {spread(sample.ttft_seconds)} "
            f"| {sample.prompt_tokens} |"
        )
    if len(samples) == 2:
        ours, theirs = samples["mlxcel"], samples["mlx-vlm"]
        encode_ratio = statistics.median(theirs.encode_seconds) / statistics.median(
            ours.encode_seconds
        )
        ttft_ratio = statistics.median(ours.ttft_seconds) / statistics.median(theirs.ttft_seconds)
        rows.append(f"| {size}² | mlxcel / mlx-vlm | {encode_ratio:.2f}x | {ttft_ratio:.2f}x | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tower", choices=sorted(VISION_TOWERS), default="clip-vit-b16")
    parser.add_argument("--image-sizes", type=int, nargs="+", default=[448, 896])
    parser.add_argument("--repeats", type=int, default=5, help="measured runs per figure")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/mlxcel-vlm-bench"))
    parser.add_argument(
        "--mlx-vlm-python",
        type=Path,
        help="an interpreter whose environment holds mlx-vlm; without it only mlxcel runs",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    pictures = write_pictures(args.work_dir / "pictures", args.repeats + 1)
    rows = []
    for size in args.image_sizes:
        folder = args.work_dir / f"llava-{args.tower}-{size}"
        if not (folder / "config.json").exists():
            write_random_llava(args.tower, size, folder)
        print(f"{args.tower} at {size}²: {folder}", file=sys.stderr)
        sides = [MlxcelSide(folder)]
        if args.mlx_vlm_python is not None:
            sides.append(MlxVlmSide(args.mlx_vlm_python, folder))
        try:
            rows += table_rows(size, measure(sides, pictures))
        finally:
            for side in sides:
                side.close()
    print("| image | runtime | encoder images/s | TTFT s | prompt tokens |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
