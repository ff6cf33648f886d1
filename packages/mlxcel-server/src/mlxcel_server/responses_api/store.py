"""A bounded in-memory store of finished responses, evicting the least recently used."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mlxcel_server.responses_api.objects import ResponseObject
from mlxcel_server.schemas import ChatMessage

DEFAULT_CAPACITY = 1000


@dataclass(frozen=True)
class StoredResponse:
    """A finished response and the conversation it continues.

    Attributes:
        response: the response object, as `GET /v1/responses/{id}` returns it.
        conversation: its input (previous turns included, instructions not) and its output.
    """

    response: ResponseObject
    conversation: tuple[ChatMessage, ...]


class ResponseStore:
    """Responses by id, at most `capacity` of them; used only from the event loop.

    Args:
        capacity: the most responses kept; adding one more drops the least recently used.

    Raises:
        ValueError: when `capacity` is below 1.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, marked as recently used; None when unknown or evicted."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse) -> None:
        """Store `entry` under its response's id, evicting the least recently used if full."""
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
