"""Where the model store lives and how the Hugging Face Hub is reached."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_ORG = "mlx-community"
DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class StoreConfig:
    """Settings of the model store; the app builds them from flags and the environment.

    Attributes:
        models_dir: the store; a model `owner/name` lives in `models_dir/owner/name`.
        hf_cache_dir: the Hugging Face cache (`$HF_HOME/hub`), read before downloading.
        endpoint: the Hub's URL.
        token: the Hub access token sent with requests; None sends none.
        offline: never reach the Hub; only the store and the Hugging Face cache are read.
        default_org: the organisation a bare model name belongs to.
    """

    models_dir: Path
    hf_cache_dir: Path
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    offline: bool = False
    default_org: str = DEFAULT_ORG

    def __post_init__(self) -> None:
        if not self.default_org or "/" in self.default_org:
            raise ValueError(f"default_org must be one organisation name, got {self.default_org!r}")
