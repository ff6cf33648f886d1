"""Metal kernels run on CPU threads, for checking their sources where no Apple GPU is.

`MetalEmulator.metal_kernel` stands in for `mx.fast.metal_kernel`: each launch writes the
kernel as MLX would wrap it (template arguments, inputs, `*_shape` arrays, outputs and the
thread attributes its body names), compiles it as C++ against metal_emulation.h, runs it
with one thread per Metal thread and returns its outputs. What it checks is the kernels'
arithmetic, indexing and synchronisation as written; not Metal's compiler, address spaces
or speed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np

COMPILER = shutil.which("g++")
_SHIM = Path(__file__).with_name("metal_emulation.h")
_TYPES = {
    mx.float32: ("float", np.float32),
    mx.float16: ("float16_t", np.float16),
    mx.bfloat16: ("bfloat16_t", np.uint16),
    mx.uint8: ("uint8_t", np.uint8),
    mx.uint16: ("uint16_t", np.uint16),
    mx.uint32: ("uint32_t", np.uint32),
    mx.int32: ("int32_t", np.int32),
    mx.bool_: ("bool", np.bool_),
}
# The attributes MLX passes a kernel whose body names them, and the emulator's name for each.
_ATTRIBUTES = {
    "thread_position_in_threadgroup": "local",
    "threadgroup_position_in_grid": "group",
    "threadgroups_per_grid": "groups",
    "thread_position_in_grid": "global",
}


def _raw(x: mx.array) -> bytes:
    """The array's bytes; bfloat16 through its uint16 view, which numpy can hold."""
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.array(x).tobytes()


def _for_cpu(text: str) -> str:
    """Threadgroup arrays as function statics; other threadgroup qualifiers dropped."""
    text = re.sub(r"\bthreadgroup\s+(float|int)\s+(\w+)\[", r"static \1 \2[", text)
    return re.sub(r"\bthreadgroup\b", "", text)


class EmulatedKernel:
    def __init__(
        self, build_dir: Path, *, name, input_names, output_names, source, header=""
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
        program = self._program(inputs, template, grid, threadgroup, output_shapes, output_dtypes)
        work = self.build_dir / hashlib.sha1(program.encode()).hexdigest()[:16]
        if not (work / "kernel").exists():
            work.mkdir(parents=True, exist_ok=True)
            (work / "kernel.cpp").write_text(program)
            command = [COMPILER, "-std=c++20", "-O1", "-w", "-pthread", "-I", str(_SHIM.parent)]
            subprocess.run([*command, "kernel.cpp", "-o", "kernel"], cwd=work, check=True)
        (work / "inputs.bin").write_bytes(b"".join(_raw(x) for x in inputs))
        subprocess.run(["./kernel"], cwd=work, check=True)
        raw = (work / "outputs.bin").read_bytes()
        outputs, offset = [], 0
        for shape, dtype in zip(output_shapes, output_dtypes, strict=True):
            numpy_type = np.dtype(_TYPES[dtype][1])
            size = int(np.prod(shape))
            values = mx.array(np.frombuffer(raw, numpy_type, size, offset).reshape(shape))
            outputs.append(values.view(mx.bfloat16) if dtype == mx.bfloat16 else values)
            offset += size * numpy_type.itemsize
        return outputs

    def _program(self, inputs, template, grid, threadgroup, output_shapes, output_dtypes) -> str:
        template_params, template_args = [], []
        for key, value in template:
            if isinstance(value, mx.Dtype):
                template_params.append(f"typename {key}")
                template_args.append(_TYPES[value][0])
            else:
                template_params.append(f"int {key}")
                template_args.append(str(int(value)))
        params, args, setup = [], [], []
        for i, (name, x) in enumerate(zip(self.input_names, inputs, strict=True)):
            ctype = _TYPES[x.dtype][0]
            params.append(f"const device {ctype}* {name}")
            args.append(f"in{i}")
            setup.append(f"auto* in{i} = new {ctype}[{max(1, x.size)}];")
            setup.append(f"fread(in{i}, sizeof({ctype}), {x.size}, in);")
            if f"{name}_shape" in self.source:
                params.append(f"const constant int* {name}_shape")
                args.append(f"shape{i}")
                setup.append(f"int shape{i}[] = {{{', '.join(map(str, x.shape))}}};")
        writes = []
        for i, (name, shape, dtype) in enumerate(
            zip(self.output_names, output_shapes, output_dtypes, strict=True)
        ):
            ctype = _TYPES[dtype][0]
            size = int(np.prod(shape))
            params.append(f"device {ctype}* {name}")
            args.append(f"out{i}")
            setup.append(f"auto* out{i} = new {ctype}[{size}];")
            writes.append(f"fwrite(out{i}, sizeof({ctype}), {size}, out);")
        for attribute, variable in _ATTRIBUTES.items():
            if attribute in self.source:
                params.append(f"uint3 {attribute}")
                args.append(variable)
        return f"""#include "metal_emulation.h"
{_for_cpu(self.header)}
template <{", ".join(template_params)}>
void {self.name}({", ".join(params)}) {{
{_for_cpu(self.source)}
}}

int main() {{
  FILE* in = fopen("inputs.bin", "rb");
  {" ".join(setup)}
  fclose(in);
  dispatch(uint3{{{", ".join(map(str, grid))}}}, uint3{{{", ".join(map(str, threadgroup))}}},
           [&](uint3 local, uint3 group, uint3 groups, uint3 global) {{
             {self.name}<{", ".join(template_args)}>({", ".join(args)});
           }});
  FILE* out = fopen("outputs.bin", "wb");
  {" ".join(writes)}
  fclose(out);
}}
"""


class MetalEmulator:
    """Builds `EmulatedKernel`s, compiled under `build_dir`."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = build_dir

    def metal_kernel(self, **definition) -> EmulatedKernel:
        return EmulatedKernel(self.build_dir, **definition)
