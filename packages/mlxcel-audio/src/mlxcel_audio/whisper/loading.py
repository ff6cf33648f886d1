"""Loads Whisper from a CTranslate2, Hugging Face or mlx-whisper folder."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel_audio.whisper.ctranslate2_format import read_model_bin
from mlxcel_audio.whisper.model import ModelDimensions, Whisper, sinusoids
from mlxcel_audio.whisper.tokenizer import WhisperTokenizer
from mlxcel_audio.whisper.weights import from_ctranslate2, from_hugging_face
from mlxcel_models.errors import ModelLoadError

ENGLISH_ONLY_VOCAB = 51864  # multilingual vocabularies are larger (OpenAI: n_vocab >= 51865)


@dataclass(frozen=True)
class WhisperModel:
    """A loaded Whisper model with what decoding needs beside the weights.

    Attributes:
        name: the folder's name.
        model: the MLX network.
        tokenizer: its tokenizer and special tokens.
        suppress_tokens: token ids never sampled (the model's config, or OpenAI's
            non-speech symbols, plus the special tokens).
        begin_suppress_tokens: token ids not sampled first (blank and end of text).
        alignment_heads: the (decoder layer, head) pairs whose cross-attention follows the
            speech in time, used for word timestamps.
    """

    name: str
    model: Whisper
    tokenizer: WhisperTokenizer
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]
    alignment_heads: tuple[tuple[int, int], ...]

    @property
    def dims(self) -> ModelDimensions:
        return self.model.dims

    @property
    def is_multilingual(self) -> bool:
        return self.dims.n_vocab > ENGLISH_ONLY_VOCAB


def load_whisper(path: str | Path) -> WhisperModel:
    """Load a Whisper model folder, detected from its files.

    - CTranslate2 (faster-whisper): `model.bin`, `config.json` (suppress ids),
      `tokenizer.json`; float32/float16/bfloat16/int8 variables.
    - Hugging Face `WhisperForConditionalGeneration`: `config.json` with `d_model`, ...,
      `model.safetensors` (or shards), `tokenizer.json`.
    - mlx-whisper: `config.json` with `n_mels`, `n_audio_ctx`, ..., `weights.safetensors`
      or `weights.npz`, and a `tokenizer.json` beside them.

    The alignment heads come from `alignment_heads` in config.json (CTranslate2,
    mlx-whisper) or generation_config.json (Hugging Face); without them, every head of the
    second half of the decoder layers, as OpenAI's `whisper/model.py` defaults.

    Weights are float32 on the CPU (MLX's CPU has no fast float16), the file's dtype
    elsewhere.

    Raises:
        ModelLoadError: the folder is missing, of no known layout, or its files are bad.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is not a Whisper model folder")
    config = _read_config(folder / "config.json")
    heads_config = config
    if (folder / "model.bin").is_file():
        dims, weights = _load_ctranslate2(folder)
        suppress = config.get("suppress_ids")
        begin_suppress = config.get("suppress_ids_begin")
    elif "d_model" in config:
        dims, weights = (
            _dims_from_hugging_face(config),
            from_hugging_face(_load_safetensors(folder)),
        )
        suppress = config.get("suppress_tokens")
        begin_suppress = config.get("begin_suppress_tokens")
        heads_config = _read_config(folder / "generation_config.json")
    elif "n_audio_state" in config:
        dims, weights = _dims_from_mlx_whisper(config), _load_mlx_whisper(folder)
        weights.setdefault(
            "encoder.positional_embedding", sinusoids(dims.n_audio_ctx, dims.n_audio_state)
        )
        suppress = begin_suppress = None
    else:
        raise ModelLoadError(
            f"{folder} holds no Whisper model: expected model.bin (CTranslate2), or a config.json "
            "of Hugging Face or mlx-whisper"
        )
    model = _build(dims, weights, folder)
    num_languages = dims.n_vocab - 51765 - int(dims.n_vocab > ENGLISH_ONLY_VOCAB)
    tokenizer = WhisperTokenizer.from_file(folder / "tokenizer.json", num_languages=num_languages)
    if suppress is None:
        suppress = tokenizer.non_speech_tokens()
    specials = (tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev,
                tokenizer.sot_lm, tokenizer.no_speech)  # fmt: skip
    if begin_suppress is None:
        begin_suppress = [*tokenizer.encode(" "), tokenizer.eot]
    return WhisperModel(
        name=folder.name,
        model=model,
        tokenizer=tokenizer,
        suppress_tokens=tuple(sorted({*suppress, *specials})),
        begin_suppress_tokens=tuple(begin_suppress),
        alignment_heads=_alignment_heads(heads_config.get("alignment_heads"), dims, folder),
    )


def _alignment_heads(
    given: list | None, dims: ModelDimensions, folder: Path
) -> tuple[tuple[int, int], ...]:
    if not given:
        first = dims.n_text_layer // 2
        return tuple(
            (layer, head)
            for layer in range(first, dims.n_text_layer)
            for head in range(dims.n_text_head)
        )
    try:
        heads = tuple((int(layer), int(head)) for layer, head in given)
    except (TypeError, ValueError):
        raise ModelLoadError(
            f"alignment_heads in {folder} must be [layer, head] pairs, got {given!r}"
        ) from None
    for layer, head in heads:
        if not (0 <= layer < dims.n_text_layer and 0 <= head < dims.n_text_head):
            raise ModelLoadError(
                f"alignment head ({layer}, {head}) in {folder} is outside the decoder's "
                f"{dims.n_text_layer} layers of {dims.n_text_head} heads"
            )
    return heads


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from None


def _load_ctranslate2(folder: Path) -> tuple[ModelDimensions, dict[str, np.ndarray]]:
    spec_name, variables = read_model_bin(folder / "model.bin")
    if spec_name != "WhisperSpec":
        raise ModelLoadError(f"{folder / 'model.bin'} is a CTranslate2 {spec_name}, not Whisper")
    conv1 = variables["encoder/conv1/weight"]
    embeddings = variables["decoder/embeddings/weight"]
    dims = ModelDimensions(
        n_mels=conv1.shape[1],
        n_audio_ctx=variables["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=int(variables["encoder/num_heads"]),
        n_audio_layer=_count_layers(variables, "encoder/layer_"),
        n_vocab=embeddings.shape[0],
        n_text_ctx=variables["decoder/position_encodings/encodings"].shape[0],
        n_text_state=embeddings.shape[1],
        n_text_head=int(variables["decoder/num_heads"]),
        n_text_layer=_count_layers(variables, "decoder/layer_"),
    )
    return dims, from_ctranslate2(variables)


def _count_layers(variables: dict[str, np.ndarray], prefix: str) -> int:
    layer = re.compile(re.escape(prefix) + r"(\d+)/")
    return len({match[1] for name in variables if (match := layer.match(name))})


def _dims_from_hugging_face(config: dict) -> ModelDimensions:
    try:
        return ModelDimensions(
            n_mels=config["num_mel_bins"],
            n_audio_ctx=config["max_source_positions"],
            n_audio_state=config["d_model"],
            n_audio_head=config["encoder_attention_heads"],
            n_audio_layer=config["encoder_layers"],
            n_vocab=config["vocab_size"],
            n_text_ctx=config["max_target_positions"],
            n_text_state=config["d_model"],
            n_text_head=config["decoder_attention_heads"],
            n_text_layer=config["decoder_layers"],
        )
    except KeyError as error:
        raise ModelLoadError(f"the Whisper config.json lacks {error.args[0]}") from None


def _dims_from_mlx_whisper(config: dict) -> ModelDimensions:
    try:
        return ModelDimensions(
            **{field: config[field] for field in ModelDimensions.__dataclass_fields__}
        )
    except KeyError as error:
        raise ModelLoadError(f"the mlx-whisper config.json lacks {error.args[0]}") from None


def _load_safetensors(folder: Path) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has a Whisper config.json but no .safetensors weights")
    tensors: dict[str, mx.array] = {}
    for file in files:
        tensors.update(mx.load(str(file)))
    return tensors


def _load_mlx_whisper(folder: Path) -> dict[str, mx.array]:
    for name in ("weights.safetensors", "weights.npz"):
        if (folder / name).is_file():
            return dict(mx.load(str(folder / name)))
    raise ModelLoadError(
        f"{folder} has an mlx-whisper config.json but no weights.safetensors or weights.npz"
    )


def _build(dims: ModelDimensions, weights: dict, folder: Path) -> Whisper:
    model = Whisper(dims)
    dtype = mx.float32 if mx.default_device() == mx.cpu else _file_dtype(weights)
    arrays = [(name, mx.array(value).astype(dtype)) for name, value in weights.items()]
    try:
        model.load_weights(arrays, strict=True)
    except ValueError as error:
        raise ModelLoadError(f"the weights in {folder} do not fit Whisper: {error}") from None
    mx.eval(model.parameters())
    return model


def _file_dtype(weights: dict) -> mx.Dtype:
    embedding = mx.array(weights["decoder.token_embedding.weight"])
    return embedding.dtype if mx.issubdtype(embedding.dtype, mx.floating) else mx.float16
