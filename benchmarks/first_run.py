"""The first minute on a fresh machine: mlxcel against mlx-lm and llama.cpp, one command.

On the default model (SmolLM2-135M-Instruct Q4_1 GGUF) and, for mlx-lm, a folder exported
from the same file (`export_mlx_lm.py`), each tool a fresh process as a user starts it:

- `generate -n 1`: wall time from launching `mlxcel generate -n 1` to its exit, against
  `python -m mlx_lm generate --max-tokens 1` (median of `--runs`, runs alternating);
- `serve`: seconds from launching `mlxcel serve` until `/health` answers 200, and from
  its ready line (the model loaded, the engine set up) until then;
- batch 1 speed: prompt and generation tokens/s and peak memory of `mlxcel bench -p P -n N`
  against `python -m mlx_lm benchmark -p P -g N`, and llama.cpp's on the GGUF itself
  through `llama-cpp-python` (`--llama-python`: a Python where it is installed; it is not
  a dependency of mlxcel, and builds llama.cpp from source).

mlx-lm runs as pip installs it, without OpenBLAS (`LD_PRELOAD` removed); mlxcel as its
command runs (it preloads OpenBLAS itself). Prints a table with the ratios the targets
name (docs/benchmarks.md) and, with `--json FILE`, writes them.

    uv run python benchmarks/first_run.py
    python3 -m uv venv /tmp/llama && python3 -m uv pip install --python /tmp/llama/bin/python \\
        llama-cpp-python==0.3.36
    uv run python benchmarks/first_run.py --llama-python /tmp/llama/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from mlxcel_models.default_model import default_model_path

PROMPT = "What is the capital of France? Answer in one sentence."
HEALTH_TIMEOUT_SECONDS = 600.0
# llama.cpp's extra buffer types (repacked weights, AMX kernels) are turned off: a native
# build on a CPU that advertises AMX crashed in its AMX matmul on this machine (a VM).
LLAMA_SCRIPT = """
import json, random, resource, sys, time
import llama_cpp.llama_cpp as llama_cpp
from llama_cpp import Llama
default_params = llama_cpp.llama_model_default_params
def without_extra_buffers():
    params = default_params()
    params.use_extra_bufts = False
    return params
llama_cpp.llama_model_default_params = without_extra_buffers
path, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=n_prompt + n_gen + 8, n_batch=n_prompt, verbose=False)
rng = random.Random(0)
prompt = [rng.randrange(100, llm.n_vocab()) for _ in range(n_prompt)]
llm.eval(prompt[:16])  # warm-up
prompt_tps, gen_tps = [], []
for _ in range(int(sys.argv[4])):
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    token = llm.sample(top_k=1)
    prompt_tps.append(n_prompt / (time.perf_counter() - start))
    start = time.perf_counter()
    for _ in range(n_gen - 1):
        llm.eval([token])
        token = llm.sample(top_k=1)
    gen_tps.append((n_gen - 1) / (time.perf_counter() - start))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"prompt_tps": sorted(prompt_tps)[len(prompt_tps) // 2],
                  "generation_tps": sorted(gen_tps)[len(gen_tps) // 2], "peak_bytes": peak}))
"""


def without_preload() -> dict[str, str]:
    """This environment without `LD_PRELOAD`: MLX with the BLAS its wheel links."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}


def run(command: list[str], environ: dict[str, str]) -> tuple[float, str]:
    """Run `command` to its exit; its wall time (s) and stdout plus stderr.

    Raises:
        RuntimeError: it exited non-zero.
    """
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environ, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def generate_wall_times(folder: Path, runs: int) -> dict[str, object]:
    mlxcel = [sys.executable, "-m", "mlxcel", "generate", "-n", "1", "--temp", "0", "-p", PROMPT]
    mlx_lm = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(folder)]
    mlx_lm += ["--max-tokens", "1", "--prompt", PROMPT]
    ours, theirs, stats = [], [], ""
    for _ in range(runs):
        seconds, stats = run(mlxcel, without_preload())
        ours.append(seconds)
        theirs.append(run(mlx_lm, without_preload())[0])
    return {
        "mlxcel_seconds": statistics.median(ours),
        "mlx_lm_seconds": statistics.median(theirs),
        "ratio": statistics.median(ours) / statistics.median(theirs),
        "mlxcel_stats": [line for line in stats.splitlines() if ": " in line][-5:],
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_health() -> dict[str, float]:
    """Launch `mlxcel serve`, poll `/health` until 200; the times, then stop it."""
    port = free_port()
    command = [sys.executable, "-m", "mlxcel", "serve", "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        server = subprocess.Popen(command, stdout=log, stderr=log, env=without_preload())
        try:
            healthy = _poll_health(port, server, start)
            log.seek(0)
            ready = re.search(r"loaded in ([\d.]+) s, engine set up in ([\d.]+) s", log.read())
        finally:
            server.terminate()
            server.wait(timeout=60)
    if ready is None:
        raise RuntimeError("mlxcel serve answered /health without printing its ready line")
    load, setup = float(ready.group(1)), float(ready.group(2))
    return {"launch_to_health_seconds": healthy, "load_seconds": load, "setup_seconds": setup}


def _poll_health(port: int, server: subprocess.Popen, start: float) -> float:
    url = f"http://127.0.0.1:{port}/health"
    while time.perf_counter() - start < HEALTH_TIMEOUT_SECONDS:
        if server.poll() is not None:
            raise RuntimeError(f"mlxcel serve exited {server.returncode} before /health")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return time.perf_counter() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"/health did not answer 200 within {HEALTH_TIMEOUT_SECONDS:.0f} s")


def mlxcel_speed(n_prompt: int, n_gen: int, runs: int) -> dict[str, float]:
    command = [sys.executable, "-m", "mlxcel", "bench", "-p", str(n_prompt), "-n", str(n_gen)]
    _, out = run([*command, "-r", str(runs)], without_preload())
    row = next(line for line in out.splitlines() if line.startswith("mlxcel "))
    prompt_tps, gen_tps, peak_mib = (float(x) for x in row.split()[1:4])
    return {"prompt_tps": prompt_tps, "generation_tps": gen_tps, "peak_bytes": peak_mib * 2**20}


def mlx_lm_speed(folder: Path, n_prompt: int, n_gen: int, runs: int) -> dict[str, float]:
    command = [sys.executable, "-m", "mlx_lm", "benchmark", "--model", str(folder)]
    command += ["-p", str(n_prompt), "-g", str(n_gen), "-n", str(runs)]
    _, out = run(command, without_preload())
    averages = dict(re.findall(r"(\w+)=([\d.]+)", out.split("Averages:")[1]))
    return {
        "prompt_tps": float(averages["prompt_tps"]),
        "generation_tps": float(averages["generation_tps"]),
        "peak_bytes": float(averages["peak_memory"]) * 1e9,  # mlx-lm reports GB
    }


def llama_cpp_speed(python: str, n_prompt: int, n_gen: int, runs: int) -> dict[str, float]:
    command = [python, "-c", LLAMA_SCRIPT, str(default_model_path()), str(n_prompt)]
    _, out = run([*command, str(n_gen), str(runs)], without_preload())
    return json.loads(out.strip().splitlines()[-1])


def export_folder(target: Path) -> Path:
    if not (target / "config.json").exists():
        script = Path(__file__).with_name("export_mlx_lm.py")
        run([sys.executable, str(script), str(target)], dict(os.environ))
    return target


def format_report(report: dict[str, object]) -> str:
    wall, health = report["generate_n1"], report["serve"]
    lines = [
        report["blas"],
        f"generate -n 1 wall time: mlxcel {wall['mlxcel_seconds']:.2f} s, mlx_lm.generate "
        f"{wall['mlx_lm_seconds']:.2f} s: {wall['ratio']:.2f}x (target <= 1.3x)",
        *(f"  mlxcel {line}" for line in wall["mlxcel_stats"]),
        f"serve: /health 200 {health['launch_to_health_seconds']:.2f} s after launch; model "
        f"loaded in {health['load_seconds']:.2f} s, engine set up in "
        f"{health['setup_seconds']:.2f} s after it (target < 5 s)",
        f"{'batch 1':<22}{'prompt tok/s':>14}{'gen tok/s':>12}{'peak MiB':>11}",
    ]
    speeds = report["speed"]
    for name, speed in speeds.items():
        lines.append(
            f"{name:<22}{speed['prompt_tps']:>14.1f}{speed['generation_tps']:>12.1f}"
            f"{speed['peak_bytes'] / 2**20:>11.1f}"
        )
    ours, theirs = speeds["mlxcel"], speeds["mlx-lm (no OpenBLAS)"]
    lines.append(
        f"mlxcel / mlx-lm: prompt {ours['prompt_tps'] / theirs['prompt_tps']:.2f}x (target >= 5x), "
        f"generation {ours['generation_tps'] / theirs['generation_tps']:.2f}x (target >= 2x), "
        f"peak memory {ours['peak_bytes'] / theirs['peak_bytes']:.2f}x (target <= 2x)"
    )
    if "llama.cpp" in speeds:
        llama = speeds["llama.cpp"]
        lines.append(
            f"mlxcel / llama.cpp: prompt {ours['prompt_tps'] / llama['prompt_tps']:.2f}x, "
            f"generation {ours['generation_tps'] / llama['generation_tps']:.2f}x "
            "(llama.cpp's peak is its process's RSS, the mapped GGUF included)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--folder",
        type=Path,
        default=Path(tempfile.gettempdir()) / "smollm2-mlx",
        help="the mlx-lm folder exported from the GGUF (written if missing)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each timing (median)")
    parser.add_argument("-p", "--n-prompt", type=int, default=128)
    parser.add_argument("-n", "--n-gen", type=int, default=32)
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python installed")
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    args = parser.parse_args()  # fmt: skip
    folder = export_folder(args.folder)
    _, version = run([sys.executable, "-m", "mlxcel", "--version"], without_preload())
    speed = {
        "mlxcel": mlxcel_speed(args.n_prompt, args.n_gen, args.runs),
        "mlx-lm (no OpenBLAS)": mlx_lm_speed(folder, args.n_prompt, args.n_gen, args.runs),
    }
    if args.llama_python:
        speed["llama.cpp"] = llama_cpp_speed(
            args.llama_python, args.n_prompt, args.n_gen, args.runs
        )
    report = {
        "blas": version.splitlines()[1] if len(version.splitlines()) > 1 else "unknown",
        "generate_n1": generate_wall_times(folder, args.runs),
        "serve": serve_health(),
        "speed": speed,
    }
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
