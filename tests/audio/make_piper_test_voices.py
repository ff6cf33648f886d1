"""Build the small random-weight Piper voices under tests/audio/data/.

The one voice on PyPI (en_US-joe-medium) has one speaker, HiFi-GAN's ResBlock2 and the
stochastic duration predictor. Piper's other voices use parts it lacks: several speakers
(`num_speakers` > 1, a `sid` input and a speaker embedding conditioning the duration
predictor, the flow and the decoder), ResBlock1 (the "high" quality voices) and, with
`--model.use_sdp false` at training, the deterministic duration predictor. This script
builds one voice of each in Piper's own architecture (`piper.train.vits.models.
SynthesizerTrn`) with small channel counts and random weights, exports it to ONNX as
`piper.train.export_onnx` does, and writes its JSON config beside it as Piper's training
does. The audio is noise; the voices serve parity tests against onnxruntime.

It needs torch, which is no dependency of the project; run it from its own environment:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 onnx piper-tts
    /tmp/torchenv/bin/python tests/audio/make_piper_test_voices.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP
from piper.train.vits.models import DurationPredictor, SynthesizerTrn
from piper.train.vits.modules import LayerNorm

DATA = Path(__file__).parent / "data"
SAMPLE_RATE = 22050
NUM_SYMBOLS = 256
OPSET_VERSION = 15  # piper.train.export_onnx.OPSET_VERSION
# Piper's ModelAudioConfig.low_quality/high_quality, with fewer upsampling channels.
RESBLOCK_2 = {
    "resblock": "2",
    "resblock_kernel_sizes": (3, 5, 7),
    "resblock_dilation_sizes": ((1, 2), (2, 6), (3, 12)),
    "upsample_rates": (8, 8, 4),
    "upsample_kernel_sizes": (16, 16, 8),
}
RESBLOCK_1 = {
    "resblock": "1",
    "resblock_kernel_sizes": (3, 7, 11),
    "resblock_dilation_sizes": ((1, 3, 5), (1, 3, 5), (1, 3, 5)),
    "upsample_rates": (8, 8, 2, 2),
    "upsample_kernel_sizes": (16, 16, 4, 4),
}


@dataclass(frozen=True)
class TestVoice:
    name: str
    audio: dict
    speakers: tuple[str, ...] = ()
    use_sdp: bool = True


VOICES = (
    TestVoice("multi-speaker", RESBLOCK_2, speakers=("ann", "bob", "cid")),
    TestVoice("resblock1", RESBLOCK_1),
    TestVoice("deterministic-durations", RESBLOCK_2, use_sdp=False),
)


def build(voice: TestVoice) -> SynthesizerTrn:
    """A small SynthesizerTrn as piper.train.vits.lightning.VitsModel builds it."""
    hidden, speaker_channels = 16, (16 if voice.speakers else 0)
    model = SynthesizerTrn(
        n_vocab=NUM_SYMBOLS,
        spec_channels=513,
        segment_size=32,
        inter_channels=16,
        hidden_channels=hidden,
        filter_channels=64,
        n_heads=2,
        n_layers=2,
        kernel_size=3,
        p_dropout=0.1,
        upsample_initial_channel=32,
        n_speakers=max(len(voice.speakers), 1),
        gin_channels=speaker_channels,
        use_sdp=voice.use_sdp,
        **voice.audio,
    )
    if not voice.use_sdp:
        # SynthesizerTrn fixes this predictor's width at 256, most of a small voice's size.
        model.dp = DurationPredictor(hidden, 64, 3, 0.5, gin_channels=speaker_channels)
    _randomize(model)
    return model


def _randomize(model: SynthesizerTrn) -> None:
    """Piper starts the flows' output convolutions at zero, which makes the flows identities,
    and its layer norms at one and zero, which the exporter stores once for all of them;
    a trained voice has neither, so they get small random weights here. The duration
    predictors' last step is shifted to about 4 frames a phoneme, so that utterances are
    neither empty nor minutes long."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith((".post", ".proj")) and isinstance(module, torch.nn.Conv1d):
                if name.startswith(("flow.", "dp.flows.")):
                    module.weight.normal_(0.0, 0.1)
                    module.bias.normal_(0.0, 0.1)
            elif isinstance(module, LayerNorm):
                module.gamma.normal_(1.0, 0.1)
                module.beta.normal_(0.0, 0.1)
        if model.use_sdp:
            model.dp.flows[0].m.fill_(-3.8)
            model.dp.flows[0].logs.fill_(1.0)
        else:
            model.dp.proj.bias.fill_(1.4)


def export(model: SynthesizerTrn, onnx_path: Path) -> None:
    """Export as piper.train.export_onnx.main does, from the model rather than a checkpoint.

    torch 2.9 made the dynamo exporter the default; Piper's published voices come from the
    TorchScript exporter (`dynamo=False`), whose graph and tensor names the loader reads.
    """
    model.eval()
    with torch.no_grad():
        model.dec.remove_weight_norm()

    def infer_forward(text, text_lengths, scales, sid=None):
        return model.infer(
            text,
            text_lengths,
            noise_scale=scales[0],
            length_scale=scales[1],
            noise_scale_w=scales[2],
            sid=sid,
        )[0].unsqueeze(1)

    model.forward = infer_forward
    sequences = torch.randint(low=0, high=NUM_SYMBOLS, size=(1, 50), dtype=torch.long)
    lengths = torch.LongTensor([sequences.size(1)])
    sid = torch.LongTensor([0]) if model.n_speakers > 1 else None
    scales = torch.FloatTensor([0.667, 1.0, 0.8])
    torch.onnx.export(
        model=model,
        args=(sequences, lengths, scales, sid),
        f=str(onnx_path),
        verbose=False,
        opset_version=OPSET_VERSION,
        input_names=["input", "input_lengths", "scales", "sid"],
        output_names=["output"],
        dynamic_axes={
            "input": {0: "batch_size", 1: "phonemes"},
            "input_lengths": {0: "batch_size"},
            "output": {0: "batch_size", 2: "time"},
        },
        dynamo=False,
    )


def config(voice: TestVoice) -> dict:
    """The voice config Piper's training writes (en_US-joe-medium.onnx.json's fields)."""
    return {
        "audio": {"sample_rate": SAMPLE_RATE, "quality": "test"},
        "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": DEFAULT_PHONEME_ID_MAP,
        "num_symbols": NUM_SYMBOLS,
        "num_speakers": max(len(voice.speakers), 1),
        "speaker_id_map": {name: index for index, name in enumerate(voice.speakers)},
        "piper_version": "1.0.0",
        "language": {"code": "en_US", "family": "en", "region": "US"},
        "dataset": voice.name,
    }


def main() -> None:
    DATA.mkdir(exist_ok=True)
    for index, voice in enumerate(VOICES):
        torch.manual_seed(1234 + index)
        onnx_path = DATA / f"{voice.name}.onnx"
        export(build(voice), onnx_path)
        Path(f"{onnx_path}.json").write_text(json.dumps(config(voice), indent=2) + "\n")
        print(f"{onnx_path}: {onnx_path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
