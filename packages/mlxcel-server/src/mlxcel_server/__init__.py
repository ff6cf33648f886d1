"""mlxcel server: the OpenAI-compatible HTTP API as a Quart app (`create_app`)."""

from mlxcel_server.app import create_app
from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState, ServingModel

__all__ = ["ServerSettings", "ServerState", "ServingModel", "create_app"]
