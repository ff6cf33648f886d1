"""A kernel source written once, spelled for CUDA or Metal.

Each kernel's body is one template: C++ both MLX backends compile, in which what differs
between them is a placeholder. `$name` (or `${name}` where a letter follows) stands for a
word of the backend's spelling: the built-in indices, shared-memory and address-space
qualifiers, barriers, math functions, `#pragma unroll`. A word whose spelling holds
`{0}`, `{1}` takes arguments, `$shuffle_xor(x, offset)`, placed where the backend puts
them. A placeholder alone on its line is a fragment of lines, indented as the
placeholder is; one spelled as nothing removes its line. A kernel passes the fragments
that are its own (a load of 16-byte vectors on CUDA, of elements on Metal) to `render`,
choosing each with `either`.

`CUDA` and `METAL` are the two backends; `build_kernel` hands a rendered source to MLX's
`mx.fast.cuda_kernel` or `mx.fast.metal_kernel`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import mlx.core as mx

_PLACEHOLDER = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_LINE_PLACEHOLDER = re.compile(r"([ \t]*)\$(?:\{(\w+)\}|(\w+))[ \t]*")


@dataclass(frozen=True, eq=False)
class Backend:
    """One MLX GPU backend for custom kernels.

    Attributes:
        name: "cuda" or "metal".
        words: the spelling of each word the templates use.
        max_shared_bytes: static shared (threadgroup) memory one block may take (bytes).
        builder: the `mx.fast` function that builds a kernel from source.
    """

    name: str
    words: Mapping[str, str]
    max_shared_bytes: int
    builder: str

    def either(self, *, cuda: str, metal: str) -> str:
        """The text of this backend among two: a fragment a kernel spells its own way."""
        return cuda if self is CUDA else metal

    def render(self, template: str, **fragments: str) -> str:
        """`template` spelled for this backend.

        Args:
            template: kernel source with placeholders (see the module's docstring).
            **fragments: text for the kernel's own placeholders, itself rendered first;
                a fragment named as a word replaces the word.

        Raises:
            KeyError: a placeholder names neither a word nor a fragment.
            ValueError: a word that takes arguments is not followed by them.
        """
        spellings = {**self.words}
        spellings.update({name: self.render(text) for name, text in fragments.items()})
        lines = []
        for line in template.split("\n"):
            alone = _LINE_PLACEHOLDER.fullmatch(line)
            if alone is None:
                lines.append(_substitute(line, spellings))
                continue
            indent, name = alone[1], alone[2] or alone[3]
            text = spellings[name]
            if text:
                lines += [indent + part if part else part for part in text.split("\n")]
        return "\n".join(lines)

    def build_kernel(
        self,
        *,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
    ) -> object:
        """The kernel MLX builds from `source` (a body) and `header`, both rendered."""
        build = getattr(mx.fast, self.builder)
        return build(
            name=name,
            input_names=list(input_names),
            output_names=list(output_names),
            source=source,
            header=header,
        )


def _substitute(text: str, spellings: Mapping[str, str]) -> str:
    out = []
    position = 0
    while (match := _PLACEHOLDER.search(text, position)) is not None:
        out.append(text[position : match.start()])
        spelling = spellings[match[1] or match[2]]
        position = match.end()
        if "{0}" in spelling:
            arguments, position = _arguments(text, position)
            spelling = spelling.format(*(_substitute(a, spellings) for a in arguments))
        out.append(spelling)
    out.append(text[position:])
    return "".join(out)


def _arguments(text: str, start: int) -> tuple[list[str], int]:
    """The comma-separated arguments in the parentheses opening at `start`, and the
    position after them."""
    if text[start : start + 1] != "(":
        raise ValueError(f"a word with arguments needs them in parentheses: {text!r}")
    depth, arguments, begin = 0, [], start + 1
    for index in range(start, len(text)):
        char = text[index]
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0:
                arguments.append(text[begin:index].strip())
                return arguments, index + 1
        elif char == "," and depth == 1:
            arguments.append(text[begin:index].strip())
            begin = index + 1
    raise ValueError(f"unbalanced parentheses after a word: {text!r}")


# Each word's spelling on CUDA and on Metal. An address space is spelled only on Metal;
# Metal has no `#pragma unroll`, and its compiler unrolls what it sees fit.
_WORDS = {
    "inline": ("__device__ __forceinline__", "inline"),
    "shared": ("__shared__", "threadgroup"),
    "device": ("", "device "),
    "thread": ("", "thread "),
    "barrier": ("__syncthreads();", "threadgroup_barrier(mem_flags::mem_threadgroup);"),
    "warp_barrier": ("__syncwarp();", "threadgroup_barrier(mem_flags::mem_threadgroup);"),
    "thread_x": ("threadIdx.x", "thread_position_in_threadgroup.x"),
    "block": ("blockIdx", "threadgroup_position_in_grid"),
    "grid": ("gridDim", "threadgroups_per_grid"),
    "global_x": ("(size_t)blockIdx.x * blockDim.x + threadIdx.x", "thread_position_in_grid.x"),
    "unroll": ("#pragma unroll", ""),
    "neg_inf": ("NEG_INF", "-INFINITY"),
    "half": ("__half", "half"),
    "max": ("fmaxf", "metal::max"),
    "min": ("min", "metal::min"),
    "exp2": ("exp2f", "metal::exp2"),
    "log": ("logf", "metal::precise::log"),
    "sqrt": ("sqrtf", "metal::sqrt"),
    "rsqrt": ("rsqrtf", "metal::rsqrt"),
    "abs": ("fabsf", "metal::abs"),
    "fma": ("fmaf", "metal::fma"),
    "popcount": ("__popc", "metal::popcount"),
    "mulhi": ("__umulhi", "mulhi"),
    "as_float": ("__int_as_float", "as_type<float>"),
    "make_uint4": ("make_uint4", "uint4"),
    "make_uint2": ("make_uint2", "uint2"),
    "shuffle_xor": ("__shfl_xor_sync(0xffffffff, {0}, {1})", "simd_shuffle_xor({0}, ushort({1}))"),
}

CUDA = Backend(
    name="cuda",
    words=MappingProxyType({word: cuda for word, (cuda, _) in _WORDS.items()}),
    max_shared_bytes=48 * 1024,
    builder="cuda_kernel",
)
"""NVIDIA GPUs through `mx.fast.cuda_kernel`, 48 KiB of static shared memory a block."""

METAL = Backend(
    name="metal",
    words=MappingProxyType({word: metal for word, (_, metal) in _WORDS.items()}),
    max_shared_bytes=32 * 1024,
    builder="metal_kernel",
)
"""Apple GPUs through `mx.fast.metal_kernel`, 32 KiB of threadgroup memory a threadgroup."""

BACKENDS = (CUDA, METAL)
