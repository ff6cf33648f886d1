"""VITS inference as Piper runs it: phoneme ids -> waveform, on MLX.

Kim et al. 2021, "Conditional Variational Autoencoder with Adversarial Learning for
End-to-End Text-to-Speech"; the reference is Piper's `vits/models.py`
(`SynthesizerTrn.infer`). The architecture's sizes are read off the voice's weights and
its convolutions' strides, paddings and dilations off the ONNX graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcel_audio.piper.duration import StochasticDurationPredictor
from mlxcel_audio.piper.errors import VoiceLoadError
from mlxcel_audio.piper.flow import ResidualCoupling, ResidualCouplingBlock
from mlxcel_audio.piper.generator import Generator
from mlxcel_audio.piper.text_encoder import TextEncoder
from mlxcel_audio.piper.weights import ConvSpec, VoiceWeights


@dataclass(frozen=True)
class Synthesis:
    """One utterance: `audio` (N,) float32 in [-1, 1] and `durations` (T,) int frames per id."""

    audio: np.ndarray
    durations: np.ndarray


class Vits(nn.Module):
    """Text encoder, stochastic duration predictor, flow and HiFi-GAN decoder of one voice."""

    def __init__(
        self,
        enc_p: TextEncoder,
        dp: StochasticDurationPredictor,
        flow: ResidualCouplingBlock,
        dec: Generator,
    ):
        super().__init__()
        self.enc_p = enc_p
        self.dp = dp
        self.flow = flow
        self.dec = dec

    def synthesize(
        self,
        phoneme_ids: list[int],
        *,
        length_scale: float,
        noise_scale: float,
        noise_w: float,
        key: mx.array,
    ) -> Synthesis:
        """Phoneme ids -> waveform, as `SynthesizerTrn.infer` (batch of one, no mask).

        Durations are ceil(exp(log-durations) * length_scale) frames per id; each frame
        becomes prod(upsample strides) samples (256 for Piper's voices).
        """
        duration_key, prior_key = mx.random.split(key)
        ids = mx.array([phoneme_ids], dtype=mx.int32)
        hidden, mean, log_scale = self.enc_p(ids)
        noise = mx.random.normal((1, len(phoneme_ids), 2), key=duration_key) * noise_w
        log_durations = self.dp(hidden, noise)
        durations = np.asarray(mx.ceil(mx.exp(log_durations) * length_scale))[0, :, 0]
        durations = durations.astype(np.int64)
        frames = np.repeat(np.arange(len(phoneme_ids)), durations)
        if frames.size == 0:
            # The reference clamps the output to one frame, which no id covers: a zero latent.
            mean, log_scale, frames = mx.zeros_like(mean), mx.zeros_like(log_scale), np.zeros(1)
        index = mx.array(frames.astype(np.int32))
        mean, log_scale = mean[:, index], log_scale[:, index]
        z_p = mean + mx.random.normal(mean.shape, key=prior_key) * mx.exp(log_scale) * noise_scale
        audio = self.dec(self.flow.reverse(z_p))
        return Synthesis(audio=np.asarray(audio[0]), durations=durations)


def make_vits(weights: VoiceWeights) -> Vits:
    """Build the model that fits `weights` and load them into it.

    Raises:
        VoiceLoadError: the voice is multi-speaker, has a deterministic duration predictor
            or HiFi-GAN's ResBlock1, or lacks a tensor the architecture needs.
    """
    t, convs = weights.tensors, weights.convs
    unsupported = [
        (any(k.startswith("emb_g.") or ".cond" in k for k in t), "multi-speaker voices"),
        ("dp.flows.0.m" not in t, "the deterministic duration predictor"),
        (any(".convs1." in k for k in t), "HiFi-GAN's ResBlock1"),
    ]
    for found, what in unsupported:
        if found:
            raise VoiceLoadError(f"this voice uses {what}, which mlxcel does not support yet")
    try:
        model = Vits(
            _text_encoder(t), _duration_predictor(t), _flow(t, convs), _generator(t, convs)
        )
        model.load_weights(list(_to_mlx_layout(t).items()), strict=True)
    except (KeyError, ValueError) as error:
        raise VoiceLoadError(
            f"the voice's weights do not fit a Piper VITS model: {error}"
        ) from None
    mx.eval(model.parameters())
    return model


def _indices(tensors: dict[str, np.ndarray], pattern: str) -> list[int]:
    """Sorted distinct integers captured by `pattern` (one group) over the tensor names."""
    regex = re.compile(pattern)
    return sorted({int(m.group(1)) for name in tensors if (m := regex.match(name))})


def _text_encoder(t: dict[str, np.ndarray]) -> TextEncoder:
    num_symbols, hidden = t["enc_p.emb.weight"].shape
    _, window, head_dim = t["enc_p.encoder.attn_layers.0.emb_rel_k"].shape
    filter_channels, _, kernel = t["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape
    return TextEncoder(
        num_symbols=num_symbols,
        inter_channels=t["enc_p.proj.weight"].shape[0] // 2,
        hidden_channels=hidden,
        filter_channels=filter_channels,
        num_heads=hidden // head_dim,
        num_layers=len(_indices(t, r"enc_p\.encoder\.attn_layers\.(\d+)\.")),
        kernel_size=kernel,
        window_size=(window - 1) // 2,
    )


def _duration_predictor(t: dict[str, np.ndarray]) -> StochasticDurationPredictor:
    channels, _, kernel = t["dp.convs.convs_sep.0.weight"].shape
    flows = _indices(t, r"dp\.flows\.(\d+)\.pre\.")
    return StochasticDurationPredictor(channels, kernel, len(flows))


def _flow(t: dict[str, np.ndarray], convs: dict[str, ConvSpec]) -> ResidualCouplingBlock:
    couplings = []
    for index in _indices(t, r"flow\.flows\.(\d+)\.pre\."):
        prefix = f"flow.flows.{index}"
        hidden, half, _ = t[f"{prefix}.pre.weight"].shape
        layers = _indices(t, rf"{re.escape(prefix)}\.enc\.in_layers\.(\d+)\.")
        kernel = t[f"{prefix}.enc.in_layers.0.weight"].shape[-1]
        specs = [convs[f"{prefix}.enc.in_layers.{i}"] for i in layers]
        couplings.append(ResidualCoupling(2 * half, hidden, kernel, specs))
    return ResidualCouplingBlock(couplings)


def _generator(t: dict[str, np.ndarray], convs: dict[str, ConvSpec]) -> Generator:
    channels, in_channels, kernel = t["dec.conv_pre.weight"].shape
    ups = [
        (*t[f"dec.ups.{i}.weight"].shape, convs[f"dec.ups.{i}"])
        for i in _indices(t, r"dec\.ups\.(\d+)\.")
    ]
    resblocks = []
    for i in _indices(t, r"dec\.resblocks\.(\d+)\."):
        prefix = f"dec.resblocks.{i}"
        c, _, k = t[f"{prefix}.convs.0.weight"].shape
        layers = _indices(t, rf"{re.escape(prefix)}\.convs\.(\d+)\.")
        resblocks.append((c, k, [convs[f"{prefix}.convs.{j}"] for j in layers]))
    return Generator(
        in_channels,
        (channels, kernel, convs["dec.conv_pre"]),
        ups,
        resblocks,
        (t["dec.conv_post.weight"].shape[-1], convs["dec.conv_post"]),
    )


def _to_mlx_layout(tensors: dict[str, np.ndarray]) -> dict[str, mx.array]:
    """PyTorch conv weights (out, in, k) -> MLX (out, k, in); transposed convs
    (in, out, k) -> (out, k, in); the affine flow's (C, 1) parameters -> (C,); flows
    renamed to their position among the flows that hold weights."""
    renames = {
        **_flow_renames(tensors, "flow.flows", "flow.couplings"),
        **_flow_renames(tensors, "dp.flows", "dp.spline_flows", skip=0),
        "dp.flows.0.": "dp.affine.",
    }
    converted = {}
    for name, value in tensors.items():
        prefix = next((p for p in renames if name.startswith(p)), None)
        target = name if prefix is None else renames[prefix] + name[len(prefix) :]
        if name.startswith("dec.ups.") and name.endswith(".weight"):
            value = value.transpose(1, 2, 0)
        elif name.endswith(".weight") and value.ndim == 3:
            value = value.transpose(0, 2, 1)
        elif name.startswith("dp.flows.0."):
            value = value.reshape(-1)
        converted[target] = mx.array(np.ascontiguousarray(value))
    return converted


def _flow_renames(
    tensors: dict[str, np.ndarray], old: str, new: str, *, skip: int | None = None
) -> dict[str, str]:
    indices = [i for i in _indices(tensors, rf"{re.escape(old)}\.(\d+)\.") if i != skip]
    return {f"{old}.{index}.": f"{new}.{rank}." for rank, index in enumerate(indices)}
