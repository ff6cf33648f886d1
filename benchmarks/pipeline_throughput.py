"""`mlxcel generate --pp N` against one process, and against another source tree's `--pp N`.

Each round runs, one after the other: one process, `--pp N` of this tree, and `--pp N` of
the baseline tree when one is given (its `packages/*/src` and `apps/*/src` put first on
`PYTHONPATH`, for every rank); every second round runs the two trees in the other order,
as the run right after the one-process run measured slower on a shared GPU (the same
tree, twice in a row: 13.6 and 16.2 s first, 12.0 and 12.6 s second). Every process gets
`OPENBLAS_NUM_THREADS=1`, so ranks that share a CPU do not spin on each other. The time is
what `generate` reports for its prompts (`N prompts: ... generated in T s` on stderr); a
split run whose text differs from one process's is reported as such.

    python benchmarks/pipeline_throughput.py short --rounds 2
    python benchmarks/pipeline_throughput.py long --baseline /tmp/old -- -m MODEL -no-cnv

Workloads: `short`, 16 short prompts (8 distinct) with 128 tokens each (decode); `long`,
16 prompts of 300 words of the benchmark text with 4 tokens each (prefill); `--tokens`
changes the tokens per prompt.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

TEXT = Path(__file__).with_name("data") / "pride_and_prejudice_ch2_3.txt"
SHORT_PROMPTS = (
    "Write a short story about a robot.",
    "Explain how rain forms.",
    "List five fruits and their colours.",
    "Describe the city of Paris.",
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
    "Give two tips for learning to cook.",
)
NUM_PROMPTS = 16
LONG_PROMPT_WORDS = 300
LONG_PROMPT_STRIDE = 53
WORKLOADS = {"short": 128, "long": 4}  # workload -> tokens generated per prompt
T = TypeVar("T")
_SUMMARY = re.compile(r"(\d+) prompts: (\d+) prompt tokens .* generated in ([0-9.]+) s")


def workload_prompts(workload: str) -> list[str]:
    """The workload's prompts, one line each."""
    if workload == "short":
        return [SHORT_PROMPTS[i % len(SHORT_PROMPTS)] for i in range(NUM_PROMPTS)]
    words = TEXT.read_text(encoding="utf-8").split()
    span = len(words) - LONG_PROMPT_WORDS
    starts = [(i * LONG_PROMPT_STRIDE) % span for i in range(NUM_PROMPTS)]
    return ["Summarise: " + " ".join(words[s : s + LONG_PROMPT_WORDS]) for s in starts]


def source_path(tree: Path) -> str:
    """`PYTHONPATH` entries that make `tree`'s packages and app shadow the installed ones."""
    sources = sorted(tree.glob("packages/*/src")) + sorted(tree.glob("apps/*/src"))
    if not sources:
        raise ValueError(f"{tree} holds no packages/*/src or apps/*/src")
    return os.pathsep.join(str(path) for path in sources)


def parse_summary(stderr: str) -> tuple[int, float]:
    """(prompt tokens, seconds) from `generate`'s summary line.

    Raises:
        ValueError: no summary line (the run failed).
    """
    match = _SUMMARY.search(stderr.replace("\r", "\n"))
    if match is None:
        raise ValueError(f"no summary line; the run ended with: {stderr[-500:]}")
    return int(match.group(2)), float(match.group(3))


def run_generate(
    prompts_file: Path, tokens: int, flags: Sequence[str], python_path: str | None
) -> tuple[str, int, float]:
    """One `generate` run: (its text on stdout, prompt tokens, seconds)."""
    environ = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if python_path is not None:
        environ["PYTHONPATH"] = os.pathsep.join(
            part for part in (python_path, environ.get("PYTHONPATH")) if part
        )
    command = [sys.executable, "-m", "mlxcel", "generate", "--temp", "0", "-n", str(tokens)]
    command += ["--prompts-file", str(prompts_file), *flags]
    result = subprocess.run(command, capture_output=True, text=True, env=environ, check=False)
    prompt_tokens, seconds = parse_summary(result.stderr)
    return result.stdout, prompt_tokens, seconds


def round_order(variants: Sequence[T], round_number: int) -> list[T]:
    """The variants in the order round `round_number` (from 1) runs them: one process
    first, then the others, reversed in every even round."""
    first, rest = variants[0], list(variants[1:])
    return [first, *(rest if round_number % 2 else rest[::-1])]


def parse_args(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and its arguments; what follows `--` in `argv` becomes `generate_flags`.

    Exits with a usage message (status 2) on bad arguments, as argparse does.
    """
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s {long,short} [options] [-- generate flags]",
    )
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages (default 2)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="another source tree to run with --pp")
    parser.add_argument("--context", type=int, default=4096, help="-c for every run")
    parser.add_argument("--tokens", type=int, help="tokens per prompt (default: the workload's)")
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.generate_flags = argv[split + 1 :]
    return parser, args


def main(argv: Sequence[str] | None = None) -> None:
    parser, args = parse_args(sys.argv[1:] if argv is None else argv)
    baseline = None
    if args.baseline is not None:
        try:
            baseline = source_path(args.baseline)
        except ValueError as error:
            parser.error(str(error))
    tokens = WORKLOADS[args.workload] if args.tokens is None else args.tokens
    flags = ["-c", str(args.context), *args.generate_flags]
    with tempfile.TemporaryDirectory() as scratch:
        prompts_file = Path(scratch) / "prompts.txt"
        prompts_file.write_text("\n".join(workload_prompts(args.workload)) + "\n")
        variants = [("one process", [], None), (f"--pp {args.pp}", ["--pp", str(args.pp)], None)]
        if baseline is not None:
            variants.append((f"--pp {args.pp}, baseline", ["--pp", str(args.pp)], baseline))
        for round_number in range(1, args.rounds + 1):
            reference = None
            for label, extra, python_path in round_order(variants, round_number):
                text, prompt_tokens, seconds = run_generate(
                    prompts_file, tokens, [*flags, *extra], python_path
                )
                reference = text if reference is None else reference
                same = "" if text == reference else " (text differs from one process)"
                print(
                    f"round {round_number}, {label}: {prompt_tokens} prompt tokens, "
                    f"{seconds:.2f} s{same}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
