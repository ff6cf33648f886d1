"""Speculative decoding's flags, shared by `serve` and `generate`.

`-md`, `--draft-max`, `--draft-min` and `--draft-p-min` are llama-server's; prompt lookup
takes vLLM's `prompt_lookup_max` / `prompt_lookup_min` settings as flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.common.flags import Flag, UsageError, flag_error
from mlxcel.common.loading import load_for_command
from mlxcel_core.cache.layout import model_cache_layout
from mlxcel_core.errors import InputError
from mlxcel_core.speculative import AcceptanceRule, SpeculativeConfig, SpeculativeMethod
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.store import parse_model_reference

SPECULATIVE_FLAGS = (
    Flag(("-md", "--model-draft"), "model_draft", str, None,
         "draft model for speculative decoding sharing the model's vocabulary (a GGUF file, "
         "a model folder or a Hugging Face id)", env="LLAMA_ARG_MODEL_DRAFT"),
    Flag(("--draft", "--draft-n", "--draft-max"), "draft_max", int, 16,
         "most draft tokens verified per step", env="LLAMA_ARG_DRAFT_MAX"),
    Flag(("--draft-n-min", "--draft-min"), "draft_min", int, 0,
         "fewer draft tokens than this are not verified", env="LLAMA_ARG_DRAFT_MIN"),
    Flag(("--draft-p-min",), "draft_p_min", float, 0.8,
         "the draft model stops at a token it gives less than this probability",
         env="LLAMA_ARG_DRAFT_P_MIN"),
    Flag(("--prompt-lookup-max",), "prompt_lookup_max", int, 0,
         "speculative decoding without a draft model: draft what followed the latest match "
         "of up to this many last tokens (0 = off)"),
    Flag(("--prompt-lookup-min",), "prompt_lookup_min", int, 1,
         "the shortest n-gram prompt lookup matches"),
    Flag(("--spec-acceptance",), "spec_acceptance", str, "rejection",
         "how sampled requests accept drafts: rejection (speculative sampling) or exact "
         "(keep a draft only if the target draws it); greedy requests always match exactly"),
)  # fmt: skip


def speculative_config_from(args: argparse.Namespace) -> SpeculativeConfig | None:
    """Speculative decoding's settings from resolved flags, or None when it is off.

    Raises:
        UsageError: a value is out of range, or both a draft model and prompt lookup are
            asked for.
    """
    if args.model_draft is not None and args.prompt_lookup_max > 0:
        raise UsageError("-md/--model-draft and --prompt-lookup-max are two drafters: pick one")
    if args.prompt_lookup_max < 0:
        raise UsageError(f"--prompt-lookup-max must be >= 0, got {args.prompt_lookup_max}")
    try:
        acceptance = AcceptanceRule(args.spec_acceptance)
    except ValueError as error:
        names = ", ".join(rule.value for rule in AcceptanceRule)
        raise UsageError(
            f"--spec-acceptance must be one of {names}, got {args.spec_acceptance!r}"
        ) from error
    if args.model_draft is not None or args.prompt_lookup_max == 0:
        # With speculation off, the draft model's settings are still checked, so a bad
        # value is refused rather than kept unused.
        method = {"method": SpeculativeMethod.DRAFT_MODEL}
    else:
        method = {
            "method": SpeculativeMethod.PROMPT_LOOKUP,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
    try:
        config = SpeculativeConfig(
            num_draft_tokens=args.draft_max,
            min_draft_tokens=args.draft_min,
            draft_p_min=args.draft_p_min,
            acceptance=acceptance,
            **method,
        )
    except ValueError as error:
        raise flag_error(str(error), _FLAG_NAMES) from error
    if args.model_draft is None and args.prompt_lookup_max == 0:
        return None
    return config


def check_draft_model_path(args: argparse.Namespace) -> None:
    """Fail before anything loads (or a server listens) when `-md` names neither a file or
    folder nor a Hugging Face id (`args.model_store` set by `resolve_store_flags`).

    Raises:
        InputError: the path does not exist and is no id.
    """
    if args.model_draft is None or Path(args.model_draft).expanduser().exists():
        return
    if parse_model_reference(args.model_draft, args.model_store.default_org) is None:
        raise InputError(f"draft model not found: {args.model_draft}")


def load_draft_model(args: argparse.Namespace, loaded: LoadedModel) -> LoadedModel | None:
    """The draft model `-md` names (an id resolved through `args.model_store` at its
    default revision), checked against the model's vocabulary; None without.

    Raises:
        ModelLoadError: it cannot be loaded.
        UsageError: it keeps recurrent state, or its vocabulary differs from the model's.
    """
    if args.model_draft is None:
        return None
    draft = load_for_command(args.model_draft, store=args.model_store)
    if model_cache_layout(draft.model).has_state:
        raise UsageError(
            f"-md/--model-draft: {args.model_draft} ({draft.source.model_type}) keeps "
            "recurrent state, which cannot be rolled back past rejected draft tokens; a "
            "draft model must keep only a KV cache"
        )
    if draft.tokenizer.vocab_size != loaded.tokenizer.vocab_size:
        raise UsageError(
            f"the draft model {args.model_draft} has {draft.tokenizer.vocab_size} tokens but "
            f"the model has {loaded.tokenizer.vocab_size}; a draft model must share the "
            "model's vocabulary"
        )
    return draft


_FLAG_NAMES = {
    "num_draft_tokens": "--draft/--draft-n/--draft-max",
    "min_draft_tokens": "--draft-n-min/--draft-min",
    "draft_p_min": "--draft-p-min",
    "prompt_lookup_min": "--prompt-lookup-min",
    "prompt_lookup_max": "--prompt-lookup-max",
}
