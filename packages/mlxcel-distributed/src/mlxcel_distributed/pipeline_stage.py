"""One rank's pipeline-parallel stage of an mlx-lm decoder, over `mx.distributed`.

Rank r of a group of P owns a contiguous range of the decoder's layers. Every rank is
called with the same tokens, in the same order: rank 0 embeds them, each rank runs its
layers over its own KV caches and sends the hidden states to rank r + 1, and the last rank
applies the final norm and the LM head and sends the logits back to rank 0, which samples.

A call may hold several forward passes (an engine step's rows, grouped by length): each
rank sends all their hidden states, or logits, in one transfer, so that a transport whose
send waits for the matching receive never finds both ends sending.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from mlxcel_core.cache import AttentionMask, DenseKVCache, KVCache
from mlxcel_distributed.pipeline_split import split_layers
from mlxcel_models.language_model import MlxLmLanguageModel

LayerWindows = Callable[[nn.Module], list[int | None]]
"""Per decoder layer, its attention window: None for full attention."""


def _llama_windows(module: nn.Module) -> list[int | None]:
    body = module.model
    return [body.sliding_window if layer.use_sliding else None for layer in body.layers]


def _full_attention_windows(module: nn.Module) -> list[int | None]:
    return [None] * len(module.model.layers)


# Families whose mlx-lm body is embed -> one mask per attention kind, taken from the layer
# caches -> layer(h, mask, cache) in order -> norm, with a tied or separate LM head.
PIPELINE_FAMILIES: dict[str, LayerWindows] = {
    "llama": _llama_windows,
    "mistral": _llama_windows,
    "qwen2": _full_attention_windows,
    "qwen3": _full_attention_windows,
}


@dataclass(frozen=True)
class StagePass:
    """One forward pass of a call: (B, L) int32 tokens, this rank's per-layer caches for
    it, and whether only the last position's logits are wanted (N = 1, else N = L)."""

    tokens: mx.array
    cache: Sequence[KVCache]
    last_only: bool = False

    @property
    def num_logits(self) -> int:
        return 1 if self.last_only else self.tokens.shape[1]


def _nbytes(module: nn.Module) -> int:
    return sum(array.nbytes for _, array in tree_flatten(module.parameters()))


def _check_family(model_type: str) -> None:
    if model_type not in PIPELINE_FAMILIES:
        raise ValueError(
            f"pipeline parallelism does not support model type '{model_type}'; "
            f"supported: {', '.join(sorted(PIPELINE_FAMILIES))}"
        )


class PipelineStage:
    """Rank `rank`'s stage of a pipeline over `group`: a `LanguageModel` for its layers.

    Every rank must make the same calls with the same token shapes in the same order (the
    lockstep the engine keeps); transfers are matched by that order alone. Each transfer is
    therefore evaluated when it is issued: left lazy, the transfers of two forward passes
    evaluated together (a step's decode batch and a prefill chunk) could run in either
    order, on one rank one way and on the next the other.

    What `__call__` returns, for (B, L) tokens (N = 1 with `last_only`, else L):
        - rank 0: the model's logits (B, N, V), received from the last rank (computed
          there when P = 1); equal to one process's logits.
        - the last rank (P > 1): the same logits, which it computed and sent.
        - any other rank: zeros broadcast to (B, N, V), never materialized.
    Logits are always computed and sent, so a caller that discards them (the middle chunks
    of a chunked prefill) should pass `last_only=True` to send one position, not L.

    Building a stage consumes `module`: the decoder layers it does not own become None
    (layer numbering, hence parameter names, is kept, as mlx-lm's pipeline does), and the
    embedding, final norm and LM head are removed from ranks that do not use them, so their
    weights are freed once no other reference holds them.

    Args:
        module: an mlx-lm `Model` of a family in `PIPELINE_FAMILIES`, weights loaded.
        layers: the global indices of the layers this rank runs (from `split_layers`).
        group: the pipeline's group; rank r runs after rank r - 1.

    Raises:
        ValueError: the model type is not in `PIPELINE_FAMILIES`, or `layers` is empty or
            not within the model's layers.
    """

    def __init__(self, module: nn.Module, layers: range, group: mx.distributed.Group) -> None:
        model_type = module.args.model_type
        _check_family(model_type)
        body = module.model
        num_layers = len(body.layers)
        if len(layers) == 0 or layers.start < 0 or layers.stop > num_layers or layers.step != 1:
            raise ValueError(
                f"layers must be a non-empty contiguous range within 0..{num_layers - 1}, "
                f"got {layers}"
            )
        self.group = group
        self.rank = group.rank()
        self.num_stages = group.size()
        self.layers = layers
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.num_stages - 1
        self.hidden_size = int(module.args.hidden_size)
        self.vocab_size = int(body.embed_tokens.weight.shape[0])
        tied = bool(module.args.tie_word_embeddings)
        self.input_dtype, self.logits_dtype = _transfer_dtypes(module, layers)
        self._windows = PIPELINE_FAMILIES[model_type](module)[layers.start : layers.stop]
        self._layers = list(body.layers[layers.start : layers.stop])
        self._embed = body.embed_tokens if self.is_first or (self.is_last and tied) else None
        self._norm = body.norm if self.is_last else None
        self._head = None
        if self.is_last:
            self._head = body.embed_tokens.as_linear if tied else module.lm_head
        body.layers = [
            layer if index in layers else None for index, layer in enumerate(body.layers)
        ]
        if self._embed is None:
            del body.embed_tokens
        if not self.is_last:
            del body.norm
            if not tied:
                del module.lm_head
        # Hand the dropped weights' buffers back to the system, not to MLX's buffer cache.
        mx.clear_cache()

    def make_cache(self) -> list[KVCache]:
        """One empty dense KV cache per layer this rank runs."""
        return [DenseKVCache() for _ in self._layers]

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        """Run this rank's part of one forward pass (see the class docstring).

        Args:
            tokens: (B, L) int32 token ids, the same on every rank.
            cache: this rank's per-layer caches (`make_cache`, or paged views of storage
                sized by `profile_model` on this stage), updated in place.
            last_only: logits for the last position only.

        Returns:
            (B, N, V) logits on rank 0 and the last rank, a placeholder elsewhere.
        """
        return self.run_passes([StagePass(tokens, cache, last_only)])[0]

    def run_passes(self, passes: Sequence[StagePass]) -> list[mx.array]:
        """Run this rank's part of several forward passes, in order, with one transfer
        between each pair of neighbouring ranks.

        Returns:
            Per pass, its (B, N, V) logits on rank 0 and the last rank, a placeholder
            elsewhere.
        """
        if self.is_first and not self.is_last:
            self.send_hidden(self.first_hidden(passes))
            return self.receive_logits([(p.tokens.shape[0], p.num_logits) for p in passes])[0]
        if self.is_first:
            return self.stage_output([self._embed(p.tokens) for p in passes], passes)
        output = self.stage_output(self.receive_hidden(passes), passes)
        self.send_output(output)
        return self.logits_of(output, passes)

    def first_hidden(self, passes: Sequence[StagePass]) -> mx.array:
        """Rank 0 of a pipeline: its layers' output over every pass, flattened to
        (sum of B * L, hidden size) as `send_hidden` sends it; lazy, like the KV writes."""
        return _flatten([self._layers_over(self._embed(p.tokens), p) for p in passes])

    def send_hidden(self, hidden: mx.array) -> None:
        """Rank 0: send `first_hidden`'s output to rank 1, evaluating it."""
        self._send(hidden, 1)

    def receive_logits(
        self, sizes: Sequence[tuple[int, int]], trailer_ints: int = 0
    ) -> tuple[list[mx.array], np.ndarray]:
        """Rank 0: the (B, N, V) logits of passes of (B, N) `sizes`, received from the last
        rank (evaluated), and the `trailer_ints` int32 values it sent after them
        (`send_output`)."""
        shapes = [(b, n, self.vocab_size) for b, n in sizes]
        last = self.num_stages - 1
        if trailer_ints == 0:
            flat = self._receive(shapes, self.logits_dtype, last)
            return _split(flat, shapes), np.zeros(0, dtype=np.int32)
        num_logits = sum(b * n for b, n, _ in shapes) * self.vocab_size
        size = num_logits + trailer_ints * np.dtype(np.int32).itemsize // self.logits_dtype.size
        received = mx.distributed.recv((size,), self.logits_dtype, last, group=self.group)
        mx.eval(received)
        logits, trailer = split_trailer(received, num_logits)
        return _split(logits.reshape(-1, self.vocab_size), shapes), trailer

    def receive_hidden(self, passes: Sequence[StagePass]) -> list[mx.array]:
        """Ranks > 0: the (B, L, hidden size) input of each pass, received from the
        previous rank (evaluated)."""
        shapes = [(*p.tokens.shape, self.hidden_size) for p in passes]
        return _split(self._receive(shapes, self.input_dtype, self.rank - 1), shapes)

    def stage_output(
        self, hidden: Sequence[mx.array], passes: Sequence[StagePass]
    ) -> list[mx.array]:
        """This rank's layers over each pass's input `hidden`, then on the last rank the
        final norm and LM head: per pass, (B, L, hidden size) hidden states, or (B, N, V)
        logits on the last rank; lazy, like the KV writes."""
        output = [self._layers_over(h, p) for h, p in zip(hidden, passes, strict=True)]
        if self.is_last:
            output = [self._logits(h, p.last_only) for h, p in zip(output, passes, strict=True)]
        return output

    def send_output(self, output: Sequence[mx.array], trailer: np.ndarray | None = None) -> None:
        """Ranks > 0: send `stage_output`'s output on, to the next rank or from the last
        to rank 0, in one transfer (evaluated); the last rank may append `trailer`, int32
        values that rank 0's `receive_logits` gives back apart."""
        flat = _flatten(output)
        if trailer is not None:
            flat = append_trailer(flat, trailer)
        self._send(flat, 0 if self.is_last else self.rank + 1)

    def logits_of(self, output: Sequence[mx.array], passes: Sequence[StagePass]) -> list[mx.array]:
        """What `run_passes` returns for `stage_output`'s output on ranks > 0: the logits
        on the last rank, placeholders elsewhere."""
        return list(output) if self.is_last else [self._placeholder(p) for p in passes]

    def _placeholder(self, stage_pass: StagePass) -> mx.array:
        zero = mx.zeros((1, 1, 1), self.logits_dtype)
        shape = (stage_pass.tokens.shape[0], stage_pass.num_logits, self.vocab_size)
        return mx.broadcast_to(zero, shape)

    def _layers_over(self, hidden: mx.array, stage_pass: StagePass) -> mx.array:
        # Every layer's cache holds the same positions, so the first one of each attention
        # kind gives the mask mlx-lm's body takes from its first layer of that kind.
        length = stage_pass.tokens.shape[1]
        masks: dict[int | None, AttentionMask] = {}
        layers = zip(self._layers, stage_pass.cache, self._windows, strict=True)
        for layer, layer_cache, window in layers:
            if window not in masks:
                masks[window] = layer_cache.make_mask(length, window_size=window)
            hidden = layer(hidden, masks[window], cache=layer_cache)
        return hidden

    def _logits(self, hidden: mx.array, last_only: bool) -> mx.array:
        hidden = self._norm(hidden)
        if last_only:
            hidden = hidden[:, -1:, :]
        return self._head(hidden)

    def _send(self, x: mx.array, destination: int) -> None:
        mx.eval(mx.distributed.send(x, destination, group=self.group))

    def _receive(
        self, shapes: Sequence[tuple[int, int, int]], dtype: mx.Dtype, source: int
    ) -> mx.array:
        """The (B, L, W) arrays of `shapes` from `source`, flattened as `_flatten` sent them."""
        num_rows = sum(b * length for b, length, _ in shapes)
        received = mx.distributed.recv((num_rows, shapes[0][2]), dtype, source, group=self.group)
        mx.eval(received)
        return received


def _flatten(arrays: Sequence[mx.array]) -> mx.array:
    """(B, L, W) arrays → one (sum of B * L, W) array, to send in one transfer."""
    rows = [a.reshape(-1, a.shape[-1]) for a in arrays]
    return rows[0] if len(rows) == 1 else mx.concatenate(rows)


def append_trailer(values: mx.array, trailer: np.ndarray) -> mx.array:
    """`values` (any shape; float32, float16 or bfloat16) and int32 `trailer` as one 1-D
    array of `values`' dtype: its elements, then the trailer's bytes read as that dtype.
    The copy moves bits without arithmetic, so every int comes back (`split_trailer`)."""
    ints = mx.array(trailer.astype(np.int32, copy=False))
    return mx.concatenate([values.reshape(-1), mx.view(ints, values.dtype)])


def split_trailer(received: mx.array, num_values: int) -> tuple[mx.array, np.ndarray]:
    """`append_trailer`'s inverse: the first `num_values` elements of 1-D `received`, and
    the int32 values after them."""
    return received[:num_values], np.array(mx.view(received[num_values:], mx.int32))


def _split(flat: mx.array, shapes: Sequence[tuple[int, int, int]]) -> list[mx.array]:
    """`_flatten`'s inverse: (sum of B * L, W) → the (B, L, W) arrays of `shapes`."""
    parts, start = [], 0
    for b, length, width in shapes:
        parts.append(flat[start : start + b * length].reshape(b, length, width))
        start += b * length
    return parts


def _transfer_dtypes(module: nn.Module, layers: range) -> tuple[mx.Dtype, mx.Dtype]:
    """The dtypes of the hidden states entering `layers` and of the logits.

    Read from a lazy one-token pass through the whole model, which is never evaluated:
    MLX knows an array's dtype when the graph is built.
    """
    body = module.model
    hidden = body.embed_tokens(mx.zeros((1, 1), mx.int32))
    input_dtype = hidden.dtype
    for index, layer in enumerate(body.layers):
        if index == layers.start:
            input_dtype = hidden.dtype
        hidden = layer(hidden, None, cache=None)
    hidden = body.norm(hidden)
    if module.args.tie_word_embeddings:
        return input_dtype, body.embed_tokens.as_linear(hidden).dtype
    return input_dtype, module.lm_head(hidden).dtype


def make_pipeline_stage(model: MlxLmLanguageModel, group: mx.distributed.Group) -> PipelineStage:
    """This rank's stage, the layers split across the group by memory (`split_layers`).

    The first stage's fixed bytes are the embedding, the last stage's the final norm and
    the LM head (the embedding again when the head is tied). Every rank computes the same
    split from the same weights.

    Args:
        model: the loaded model; its module is consumed (see `PipelineStage`).
        group: the pipeline's group, one stage per rank.

    Raises:
        ValueError: the model type is not supported, or the group has more ranks than the
            model has layers.
    """
    module = model.module
    body = module.model
    _check_family(module.args.model_type)
    num_stages = group.size()
    if num_stages > len(body.layers):
        raise ValueError(
            f"the pipeline has {num_stages} ranks but the model only {len(body.layers)} layers"
        )
    head = body.embed_tokens if module.args.tie_word_embeddings else module.lm_head
    stage_bytes = [0] * num_stages
    stage_bytes[0] += _nbytes(body.embed_tokens)
    stage_bytes[-1] += _nbytes(body.norm) + _nbytes(head)
    split = split_layers(
        [_nbytes(layer) for layer in body.layers], num_stages, stage_bytes=stage_bytes
    )
    return PipelineStage(module, split[group.rank()], group)
