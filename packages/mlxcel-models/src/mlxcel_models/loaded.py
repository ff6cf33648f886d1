"""`LoadedModel`: the one object callers hold for a loaded model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mlxcel_core.language_model import LanguageModel
from mlxcel_models.detection import ModelSource
from mlxcel_models.image_prompt import ImagePrompter
from mlxcel_models.metadata import FamilyMetadata
from mlxcel_models.surgery import EffectiveEdit
from mlxcel_models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mlxcel_models.lora import LoraAdapters


@dataclass(frozen=True)
class TypeConversion:
    """What the tensors of one ggml type of a GGUF file became.

    Attributes:
        type_name: the ggml type ("Q4_K").
        form: its MLX form ("4-bit g32", "mxfp4", "bfloat16", or the float type itself).
        num_tensors: how many tensors of the file took this path.
    """

    type_name: str
    form: str
    num_tensors: int

    def held_as(self, *, quantized: bool, float_dtype: str | None) -> TypeConversion:
        """What these tensors are once the device's compute options were applied: a
        quantized form stays only in a `quantized` model (else it was made dense), and
        every float tensor is in `float_dtype` when the model's floats share one."""
        if self.form in _FLOAT_FORMS.values() or not quantized:
            return replace(self, form=float_dtype or self.form)
        return self

    def __str__(self) -> str:
        plural = "tensor" if self.num_tensors == 1 else "tensors"
        if self.form == _FLOAT_FORMS.get(self.type_name):
            return f"{self.type_name} ({self.num_tensors} {plural})"
        return f"{self.type_name}→{self.form} ({self.num_tensors} {plural})"


_FLOAT_FORMS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters callers need without knowing the architecture.

    Attributes:
        context_length: the context window the model was trained for (tokens).
        vocab_size: rows of the embedding table.
        num_layers: decoder layers.
        num_parameters: parameter count, counting quantized weights unpacked.
        weight_bytes: bytes the weights occupy in memory.
        quantized: some layers are kept in the file's quantized form (not made dense).
        float_dtype: the dtype of every float weight ("float32"), quantized layers'
            scales included; None when they differ or are not known.
    """

    context_length: int
    vocab_size: int
    num_layers: int
    num_parameters: int
    weight_bytes: int
    quantized: bool = False
    float_dtype: str | None = None


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to generate: network, tokenizer, configuration and capabilities.

    Attributes:
        model: the network behind mlxcel-core's `LanguageModel` protocol: an
            `MlxLmLanguageModel` for a text model; for a vision-language model, also an
            `ImageLanguageModel`.
        tokenizer: its tokenizer and chat template.
        config: architecture-independent hyperparameters.
        family: the family's metadata (kind, formats, adapter support).
        source: where it was loaded from.
        load_seconds: wall time of the load, weights evaluated.
        adapters: the LoRA adapters attached by `apply_adapters`, or None.
        surgery: the weight edits applied while loading (`--surgery`), in order.
        image_prompter: a vision-language model's image preprocessing; None for a model
            without vision support.
        gguf_conversions: for a GGUF file, what each of its tensor types became.
    """

    model: LanguageModel
    tokenizer: Tokenizer
    config: ModelConfig
    family: FamilyMetadata
    source: ModelSource
    load_seconds: float
    adapters: LoraAdapters | None = None
    surgery: tuple[EffectiveEdit, ...] = ()
    image_prompter: ImagePrompter | None = None
    gguf_conversions: tuple[TypeConversion, ...] = ()

    @property
    def row_adapters(self) -> LoraAdapters | None:
        """The adapters whose scales are set per request (unfused ones), for the engine."""
        return None if self.adapters is None or self.adapters.fused else self.adapters
