"""mlxcel server: the OpenAI-compatible HTTP API as a Quart app (`create_app`)."""

from typing import TYPE_CHECKING, Any

from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState, ServingModel

if TYPE_CHECKING:
    from mlxcel_server.app import create_app

__all__ = ["ServerSettings", "ServerState", "ServingModel", "create_app"]


def __getattr__(name: str) -> Any:
    # The app brings Quart and pydantic, which the command line's other commands (generate,
    # the ranks of --tp and --pp) do not use: it is imported when first asked for.
    if name == "create_app":
        from mlxcel_server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
