"""`mlxcel serve`'s access log: one line on stderr per HTTP response, written by Hypercorn
once the response ends (a stream's line comes when the stream ends).

A line reads `mlxcel: 127.0.0.1 POST /v1/chat/completions 200 0.412 s`: the client's
address, the method, the path (without its query string, which may hold secrets), the
status and the seconds from the request to the response's end, as llama-server logs
each request. `--log-disable` turns it off.
"""

from __future__ import annotations

import logging
from typing import TextIO

ACCESS_LOGGER = "mlxcel.access"


class _AccessLineFormatter(logging.Formatter):
    """Formats Hypercorn's access record, whose argument is its `AccessLogAtoms`."""

    def format(self, record: logging.LogRecord) -> str:
        atoms = record.args
        if not isinstance(atoms, dict):
            return super().format(record)
        client = atoms["h"].rsplit(":", 1)[0] if atoms["h"] else "-"
        seconds = float(atoms["L"])
        return f"mlxcel: {client} {atoms['m']} {atoms['U']} {atoms['s']} {seconds:.3f} s"


def access_logger(err: TextIO) -> logging.Logger:
    """The logger to give Hypercorn as its `accesslog`: each response's line on `err`."""
    handler = logging.StreamHandler(err)
    handler.setFormatter(_AccessLineFormatter())
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger
