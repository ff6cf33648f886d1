"""CUDA kernels run on CPU threads, for checking their sources where no CUDA GPU is.

`CudaEmulator.cuda_kernel` stands in for `mx.fast.cuda_kernel`: each launch writes the
kernel as MLX's CUDA backend wraps it (pointer parameters for inputs and outputs, a
`*_shape` array for each input whose name the source uses with that suffix, the template
arguments as `constexpr int` and `using` lines at the top of the body), compiles it as C++
against cuda_emulation.h, runs it with one thread per CUDA thread, blocks one at a time,
and returns its outputs. What it checks is the kernels' arithmetic, indexing and
synchronisation as written; not NVRTC, memory coalescing or speed. A kernel whose warp
lanes do not all reach a shuffle or barrier hangs, and the launch's timeout reports it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np

COMPILER = shutil.which("g++")
LAUNCH_TIMEOUT_SECONDS = 120
_SHIM = Path(__file__).with_name("cuda_emulation.h")
# MLX's CUDA type names, and the numpy dtype carrying each dtype's bytes.
_TYPES = {
    mx.float32: ("float", np.float32),
    mx.float16: ("__half", np.float16),
    mx.bfloat16: ("__nv_bfloat16", np.uint16),
    mx.uint8: ("uint8_t", np.uint8),
    mx.uint32: ("uint32_t", np.uint32),
    mx.int32: ("int32_t", np.int32),
    mx.bool_: ("bool", np.bool_),
}


def _raw(x: mx.array) -> bytes:
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.ascontiguousarray(np.array(x)).tobytes()


def _from_raw(raw: bytes, offset: int, shape, dtype: mx.Dtype) -> mx.array:
    numpy_type = np.dtype(_TYPES[dtype][1])
    values = np.frombuffer(raw, numpy_type, int(np.prod(shape)), offset).reshape(shape)
    out = mx.array(values)
    return out.view(mx.bfloat16) if dtype == mx.bfloat16 else out


class EmulatedCudaKernel:
    def __init__(
        self, build_dir: Path, *, name, input_names, output_names, source, header="", **_
    ) -> None:
        self.build_dir = build_dir
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header

    def __call__(
        self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **_
    ) -> list[mx.array]:
        if threadgroup[1:] != (1, 1):
            raise ValueError(f"the emulator runs one-dimensional blocks, got {threadgroup}")
        program = self._program(inputs, template, output_shapes, output_dtypes)
        work = self.build_dir / hashlib.sha1(program.encode()).hexdigest()[:16]
        if not (work / "kernel").exists():
            work.mkdir(parents=True, exist_ok=True)
            (work / "kernel.cpp").write_text(program)
            command = [COMPILER, "-std=c++20", "-O1", "-w", "-pthread", "-I", str(_SHIM.parent)]
            subprocess.run([*command, "kernel.cpp", "-o", "kernel"], cwd=work, check=True)
        (work / "inputs.bin").write_bytes(b"".join(_raw(x) for x in inputs))
        blocks = [-(-g // t) for g, t in zip(grid, threadgroup, strict=True)]
        subprocess.run(
            ["./kernel", *map(str, blocks), str(threadgroup[0])],
            cwd=work,
            check=True,
            timeout=LAUNCH_TIMEOUT_SECONDS,
        )
        raw = (work / "outputs.bin").read_bytes()
        outputs, offset = [], 0
        for shape, dtype in zip(output_shapes, output_dtypes, strict=True):
            outputs.append(_from_raw(raw, offset, shape, dtype))
            offset += int(np.prod(shape)) * np.dtype(_TYPES[dtype][1]).itemsize
        return outputs

    def _program(self, inputs, template, output_shapes, output_dtypes) -> str:
        constants = []
        for key, value in template:
            if isinstance(value, mx.Dtype):
                constants.append(f"  using {key} = {_TYPES[value][0]};")
            elif isinstance(value, bool):
                constants.append(f"  constexpr bool {key} = {'true' if value else 'false'};")
            else:
                constants.append(f"  constexpr int {key} = {int(value)};")
        params, args, setup = [], [], []
        for i, (name, x) in enumerate(zip(self.input_names, inputs, strict=True)):
            ctype = _TYPES[x.dtype][0]
            params.append(f"const {ctype}* {name}")
            args.append(f"in{i}")
            bytes_ = max(64, -(-x.nbytes // 64) * 64)
            setup.append(f"auto* in{i} = static_cast<{ctype}*>(aligned_alloc(64, {bytes_}));")
            setup.append(f"fread(in{i}, 1, {x.nbytes}, in);")
            if f"{name}_shape" in self.source:
                params.append(f"const int* {name}_shape")
                args.append(f"shape{i}")
                setup.append(f"static int shape{i}[] = {{{', '.join(map(str, x.shape))}}};")
        writes = []
        for i, (name, shape, dtype) in enumerate(
            zip(self.output_names, output_shapes, output_dtypes, strict=True)
        ):
            ctype = _TYPES[dtype][0]
            nbytes = int(np.prod(shape)) * np.dtype(_TYPES[dtype][1]).itemsize
            params.append(f"{ctype}* {name}")
            args.append(f"out{i}")
            allocated = max(64, -(-nbytes // 64) * 64)
            setup.append(f"auto* out{i} = static_cast<{ctype}*>(aligned_alloc(64, {allocated}));")
            # Poisoned, so that an element the kernel never writes shows.
            setup.append(f"memset(out{i}, 0x7f, {nbytes});")
            writes.append(f"fwrite(out{i}, 1, {nbytes}, out);")
        constants_text = "\n".join(constants)
        return f"""#include "cuda_emulation.h"
{self.header}
void {self.name}({", ".join(params)}) {{
{constants_text}
{self.source}
}}

int main(int argc, char** argv) {{
  const dim3 grid{{unsigned(atoi(argv[1])), unsigned(atoi(argv[2])), unsigned(atoi(argv[3]))}};
  const dim3 block{{unsigned(atoi(argv[4])), 1, 1}};
  FILE* in = fopen("inputs.bin", "rb");
  {" ".join(setup)}
  fclose(in);
  launch(grid, block, [&]() {{ {self.name}({", ".join(args)}); }});
  FILE* out = fopen("outputs.bin", "wb");
  {" ".join(writes)}
  fclose(out);
}}
"""


class CudaEmulator:
    """Builds `EmulatedCudaKernel`s, compiled under `build_dir`."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = build_dir

    def cuda_kernel(self, **definition) -> EmulatedCudaKernel:
        return EmulatedCudaKernel(self.build_dir, **definition)
