"""The Whisper encoder-decoder on MLX.

Source: Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision",
and OpenAI's `whisper/model.py`; parameter names follow mlx-whisper's, so its folders load
as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np


@dataclass(frozen=True)
class ModelDimensions:
    """A Whisper model's shape, in mlx-whisper's (and OpenAI's) names."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> mx.array:
    """The encoder's fixed positional embedding, shape (length, channels), float32."""
    log_increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = np.exp(-log_increment * np.arange(channels // 2))
    scaled_time = np.arange(length)[:, None] * inv_timescales[None, :]
    return mx.array(
        np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1), dtype=mx.float32
    )


KVCache = tuple[mx.array, mx.array]


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def project_kv(self, x: mx.array) -> KVCache:
        """Keys and values of shape (B, H, L, D) for `x` of shape (B, L, n_state)."""
        return self._split_heads(self.key(x)), self._split_heads(self.value(x))

    def __call__(
        self,
        x: mx.array,
        *,
        kv: KVCache | None = None,
        cache: KVCache | None = None,
        mask: mx.array | str | None = None,
    ) -> tuple[mx.array, KVCache]:
        """Self-attention over `x` (appending to `cache`), or cross-attention to fixed `kv`."""
        B, L, _ = x.shape
        q = self._split_heads(self.query(x))
        if kv is None:
            k, v = self.project_kv(x)
            if cache is not None:
                k = mx.concatenate([cache[0], k], axis=2)
                v = mx.concatenate([cache[1], v], axis=2)
            kv = (k, v)
        scale = q.shape[-1] ** -0.5
        o = mx.fast.scaled_dot_product_attention(q, kv[0], kv[1], scale=scale, mask=mask)
        return self.out(o.transpose(0, 2, 1, 3).reshape(B, L, -1)), kv

    def cross_attention_scores(self, x: mx.array, kv: KVCache) -> tuple[mx.array, mx.array]:
        """Cross-attention to `kv` computed in full, for alignment.

        Returns:
            The output (B, L, n_state), and the scaled query-key products before the
            softmax, (B, H, L, S) float32.
        """
        B, L, _ = x.shape
        q = self._split_heads(self.query(x))
        scores = (q @ kv[0].transpose(0, 1, 3, 2)) * q.shape[-1] ** -0.5
        o = mx.softmax(scores, axis=-1, precise=True) @ kv[1]
        return self.out(o.transpose(0, 2, 1, 3).reshape(B, L, -1)), scores.astype(mx.float32)

    def _split_heads(self, x: mx.array) -> mx.array:
        B, L, _ = x.shape
        return x.reshape(B, L, self.n_head, -1).transpose(0, 2, 1, 3)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, *, cross_attention: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        if cross_attention:
            self.cross_attn = MultiHeadAttention(n_state, n_head)
            self.cross_attn_ln = nn.LayerNorm(n_state)
        self.mlp1 = nn.Linear(n_state, 4 * n_state)
        self.mlp2 = nn.Linear(4 * n_state, n_state)
        self.mlp_ln = nn.LayerNorm(n_state)

    def __call__(
        self,
        x: mx.array,
        *,
        cross_kv: KVCache | None = None,
        cache: KVCache | None = None,
        mask: mx.array | str | None = None,
    ) -> tuple[mx.array, KVCache]:
        attended, cache = self.attn(self.attn_ln(x), cache=cache, mask=mask)
        x = x + attended
        if cross_kv is not None:
            x = x + self.cross_attn(self.cross_attn_ln(x), kv=cross_kv)[0]
        x = x + self.mlp2(nn.gelu(self.mlp1(self.mlp_ln(x))))
        return x, cache

    def with_cross_attention_scores(
        self, x: mx.array, cross_kv: KVCache, mask: mx.array | str | None
    ) -> tuple[mx.array, mx.array]:
        """The block without a cache, also returning its cross-attention scores
        (B, H, L, S) before the softmax."""
        x = x + self.attn(self.attn_ln(x), mask=mask)[0]
        attended, scores = self.cross_attn.cross_attention_scores(self.cross_attn_ln(x), cross_kv)
        x = x + attended
        x = x + self.mlp2(nn.gelu(self.mlp1(self.mlp_ln(x))))
        return x, scores


class AudioEncoder(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.conv1 = nn.Conv1d(dims.n_mels, dims.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(
            dims.n_audio_state, dims.n_audio_state, kernel_size=3, stride=2, padding=1
        )
        self.positional_embedding = sinusoids(dims.n_audio_ctx, dims.n_audio_state)
        self.blocks = [
            ResidualAttentionBlock(dims.n_audio_state, dims.n_audio_head)
            for _ in range(dims.n_audio_layer)
        ]
        self.ln_post = nn.LayerNorm(dims.n_audio_state)

    def __call__(self, features: mx.array) -> mx.array:
        """(B, 3000, n_mels) log-mel features -> (B, 1500, n_audio_state) audio states."""
        x = nn.gelu(self.conv1(features))
        x = nn.gelu(self.conv2(x))
        x = x + self.positional_embedding[: x.shape[1]]
        for block in self.blocks:
            x, _ = block(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.token_embedding = nn.Embedding(dims.n_vocab, dims.n_text_state)
        self.positional_embedding = mx.zeros((dims.n_text_ctx, dims.n_text_state))
        self.blocks = [
            ResidualAttentionBlock(dims.n_text_state, dims.n_text_head, cross_attention=True)
            for _ in range(dims.n_text_layer)
        ]
        self.ln = nn.LayerNorm(dims.n_text_state)

    def cross_kv(self, audio_states: mx.array) -> list[KVCache]:
        """Each block's cross-attention keys and values, computed once per window."""
        return [block.cross_attn.project_kv(audio_states) for block in self.blocks]

    def __call__(
        self, tokens: mx.array, cross_kv: list[KVCache], cache: list[KVCache] | None = None
    ) -> tuple[mx.array, list[KVCache]]:
        """(B, L) token ids after `cache` -> float32 logits (B, L, n_vocab) and the cache."""
        offset = 0 if cache is None else cache[0][0].shape[2]
        L = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positional_embedding[offset : offset + L]
        mask = "causal" if L > 1 else None
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(
                x, cross_kv=cross_kv[i], cache=None if cache is None else cache[i], mask=mask
            )
            new_cache.append(layer_cache)
        logits = self.token_embedding.as_linear(self.ln(x))
        return logits.astype(mx.float32), new_cache

    def cross_attention_scores(
        self, tokens: mx.array, cross_kv: list[KVCache]
    ) -> tuple[mx.array, list[mx.array]]:
        """A teacher-forced pass over known tokens, for aligning them with the audio.

        Args:
            tokens: (B, L) token ids from the start of the sequence.
            cross_kv: from `cross_kv`.

        Returns:
            float32 logits (B, L, n_vocab), and per layer the cross-attention scores
            (B, n_text_head, L, n_audio_ctx) before the softmax, scaled by 1/sqrt(head dim).
        """
        L = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positional_embedding[:L]
        mask = "causal" if L > 1 else None
        scores = []
        for block, kv in zip(self.blocks, cross_kv, strict=True):
            x, layer_scores = block.with_cross_attention_scores(x, kv, mask)
            scores.append(layer_scores)
        logits = self.token_embedding.as_linear(self.ln(x))
        return logits.astype(mx.float32), scores


class Whisper(nn.Module):
    """Encoder and decoder; `load_whisper` fills the weights."""

    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)
