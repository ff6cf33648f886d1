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

from mlxcel_audio.piper.duration import DurationPredictor, StochasticDurationPredictor
from mlxcel_audio.piper.errors import VoiceLoadError
from mlxcel_audio.piper.flow import ResidualCoupling, ResidualCouplingBlock
from mlxcel_audio.piper.generator import Generator, ResBlock1, ResBlock2
from mlxcel_audio.piper.text_encoder import TextEncoder
from mlxcel_audio.piper.weights import ConvSpec, VoiceWeights


@dataclass(frozen=True)
class Synthesis:
    """One utterance: `audio` (N,) float32 in [-1, 1] and `durations` (T,) int frames per id."""

    audio: np.ndarray
    durations: np.ndarray


class Vits(nn.Module):
    """Text encoder, duration predictor, flow and HiFi-GAN decoder of one voice, and the
    speaker embeddings `emb_g` of a multi-speaker voice.

    Attributes:
        num_speakers: rows of the speaker embedding; 1 for a single-speaker voice.
    """

    def __init__(
        self,
        enc_p: TextEncoder,
        dp: StochasticDurationPredictor | DurationPredictor,
        flow: ResidualCouplingBlock,
        dec: Generator,
        speaker_embedding: tuple[int, int] | None = None,
    ):
        """speaker_embedding: (speakers, channels) of a multi-speaker voice, else None."""
        super().__init__()
        self.enc_p = enc_p
        self.dp = dp
        self.flow = flow
        self.dec = dec
        self.num_speakers = 1
        if speaker_embedding is not None:
            self.num_speakers = speaker_embedding[0]
            self.emb_g = nn.Embedding(*speaker_embedding)

    def synthesize(
        self,
        phoneme_ids: list[int],
        *,
        speaker_id: int | None,
        length_scale: float,
        noise_scale: float,
        noise_w: float,
        key: mx.array,
    ) -> Synthesis:
        """Phoneme ids -> waveform, as `SynthesizerTrn.infer` (batch of one, no mask).

        `speaker_id` is in [0, num_speakers) for a multi-speaker voice, None otherwise.
        Durations are ceil(exp(log-durations) * length_scale) frames per id; each frame
        becomes prod(upsample strides) samples (256 for Piper's voices). `noise_w` scales
        the stochastic duration predictor's noise; the deterministic one has none.

        Raises:
            ValueError: `speaker_id` is None for a multi-speaker voice, given for a
                single-speaker one, or out of range.
        """
        speaker = self._speaker_embedding(speaker_id)
        duration_key, prior_key = mx.random.split(key)
        ids = mx.array([phoneme_ids], dtype=mx.int32)
        hidden, mean, log_scale = self.enc_p(ids)
        if isinstance(self.dp, StochasticDurationPredictor):
            noise = mx.random.normal((1, len(phoneme_ids), 2), key=duration_key) * noise_w
            log_durations = self.dp(hidden, noise, speaker)
        else:
            log_durations = self.dp(hidden, speaker)
        durations = np.asarray(mx.ceil(mx.exp(log_durations) * length_scale))[0, :, 0]
        durations = durations.astype(np.int64)
        frames = np.repeat(np.arange(len(phoneme_ids)), durations)
        if frames.size == 0:
            # The reference clamps the output to one frame, which no id covers: a zero latent.
            mean, log_scale, frames = mx.zeros_like(mean), mx.zeros_like(log_scale), np.zeros(1)
        index = mx.array(frames.astype(np.int32))
        mean, log_scale = mean[:, index], log_scale[:, index]
        z_p = mean + mx.random.normal(mean.shape, key=prior_key) * mx.exp(log_scale) * noise_scale
        audio = self.dec(self.flow.reverse(z_p, speaker), speaker)
        return Synthesis(audio=np.asarray(audio[0]), durations=durations)

    def _speaker_embedding(self, speaker_id: int | None) -> mx.array | None:
        """The speaker's embedding (1, 1, G), None for a single-speaker voice."""
        if "emb_g" not in self:
            if speaker_id is not None:
                raise ValueError("this voice has one speaker; speaker_id must be None")
            return None
        if speaker_id is None or not 0 <= speaker_id < self.num_speakers:
            raise ValueError(
                f"speaker_id must be in [0, {self.num_speakers}) for this voice, got {speaker_id}"
            )
        return self.emb_g(mx.array([[speaker_id]]))


def make_vits(weights: VoiceWeights) -> Vits:
    """Build the model that fits `weights` and load them into it.

    The voice's parts follow from its tensors: a speaker embedding `emb_g` makes it
    multi-speaker, `dp.flows` the stochastic duration predictor (else the deterministic
    one), `convs1` in the decoder's residual blocks ResBlock1 (else ResBlock2).

    Raises:
        VoiceLoadError: the voice lacks a tensor the architecture needs, or one has a shape
            that does not fit.
    """
    t, convs = weights.tensors, weights.convs
    speakers = t["emb_g.weight"].shape if "emb_g.weight" in t else None
    speaker_channels = 0 if speakers is None else speakers[1]
    try:
        model = Vits(
            _text_encoder(t),
            _duration_predictor(t, speaker_channels),
            _flow(t, convs, speaker_channels),
            _generator(t, convs, speaker_channels),
            speakers,
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


def _duration_predictor(
    t: dict[str, np.ndarray], speaker_channels: int
) -> StochasticDurationPredictor | DurationPredictor:
    if "dp.flows.0.m" not in t:
        filter_channels, channels, kernel = t["dp.conv_1.weight"].shape
        return DurationPredictor(channels, filter_channels, kernel, speaker_channels)
    channels, _, kernel = t["dp.convs.convs_sep.0.weight"].shape
    flows = _indices(t, r"dp\.flows\.(\d+)\.pre\.")
    return StochasticDurationPredictor(channels, kernel, len(flows), speaker_channels)


def _flow(
    t: dict[str, np.ndarray], convs: dict[str, ConvSpec], speaker_channels: int
) -> ResidualCouplingBlock:
    couplings = []
    for index in _indices(t, r"flow\.flows\.(\d+)\.pre\."):
        prefix = f"flow.flows.{index}"
        hidden, half, _ = t[f"{prefix}.pre.weight"].shape
        layers = _indices(t, rf"{re.escape(prefix)}\.enc\.in_layers\.(\d+)\.")
        kernel = t[f"{prefix}.enc.in_layers.0.weight"].shape[-1]
        specs = [convs[f"{prefix}.enc.in_layers.{i}"] for i in layers]
        couplings.append(ResidualCoupling(2 * half, hidden, kernel, specs, speaker_channels))
    return ResidualCouplingBlock(couplings)


def _generator(
    t: dict[str, np.ndarray], convs: dict[str, ConvSpec], speaker_channels: int
) -> Generator:
    channels, in_channels, kernel = t["dec.conv_pre.weight"].shape
    ups = [
        (*t[f"dec.ups.{i}.weight"].shape, convs[f"dec.ups.{i}"])
        for i in _indices(t, r"dec\.ups\.(\d+)\.")
    ]
    resblocks = [
        _resblock(t, convs, f"dec.resblocks.{i}") for i in _indices(t, r"dec\.resblocks\.(\d+)\.")
    ]
    return Generator(
        in_channels,
        (channels, kernel, convs["dec.conv_pre"]),
        ups,
        resblocks,
        (t["dec.conv_post.weight"].shape[-1], convs["dec.conv_post"]),
        speaker_channels,
    )


def _resblock(
    t: dict[str, np.ndarray], convs: dict[str, ConvSpec], prefix: str
) -> ResBlock1 | ResBlock2:
    """The residual block at `prefix`: ResBlock1 when it has `convs1`, else ResBlock2."""

    def specs(group: str) -> list[ConvSpec]:
        layers = _indices(t, rf"{re.escape(prefix)}\.{group}\.(\d+)\.")
        return [convs[f"{prefix}.{group}.{j}"] for j in layers]

    if f"{prefix}.convs1.0.weight" in t:
        channels, _, kernel = t[f"{prefix}.convs1.0.weight"].shape
        return ResBlock1(channels, kernel, specs("convs1"), specs("convs2"))
    channels, _, kernel = t[f"{prefix}.convs.0.weight"].shape
    return ResBlock2(channels, kernel, specs("convs"))


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
