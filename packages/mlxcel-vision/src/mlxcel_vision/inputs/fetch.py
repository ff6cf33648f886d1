"""`http(s)` image URLs, fetched with the standard library when the operator allows it."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from http.client import HTTPResponse

from mlxcel_vision.inputs.errors import ImageInputError

# Only HTTP(S), also when following redirects: no ftp:, file: or data: behind a redirect.
_OPENER = urllib.request.OpenerDirector()
for _handler in (
    urllib.request.HTTPHandler(),
    urllib.request.HTTPSHandler(),
    urllib.request.HTTPRedirectHandler(),
    urllib.request.HTTPErrorProcessor(),
    urllib.request.HTTPDefaultErrorHandler(),
):
    _OPENER.add_handler(_handler)


_CHUNK_BYTES = 64 * 1024


class _DeadlinePassed(Exception):
    pass


def fetch_url(url: str, *, number: int, max_bytes: int, timeout_seconds: float) -> bytes:
    """GET `url` and return its body of at most `max_bytes`.

    Args:
        timeout_seconds: limit on connecting, on each read, and on the whole body: a body
            still arriving `timeout_seconds` after the request began is refused, so a server
            that trickles bytes cannot hold the request (seconds).

    Raises:
        ImageInputError: a non-2xx status, a network error, a timeout, or a body larger
            than `max_bytes`.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "mlxcel"})
    deadline = time.monotonic() + timeout_seconds
    try:
        with _OPENER.open(request, timeout=timeout_seconds) as response:
            data = _read_body(response, max_bytes + 1, deadline)
    except _DeadlinePassed as error:
        raise ImageInputError(
            number, f"fetching {url} timed out after {timeout_seconds:g} s"
        ) from error
    except urllib.error.HTTPError as error:
        raise ImageInputError(number, f"fetching {url} failed: HTTP {error.code}") from error
    except TimeoutError as error:
        raise ImageInputError(
            number, f"fetching {url} timed out after {timeout_seconds:g} s"
        ) from error
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            raise ImageInputError(
                number, f"fetching {url} timed out after {timeout_seconds:g} s"
            ) from error
        raise ImageInputError(number, f"fetching {url} failed: {error.reason}") from error
    except (OSError, ValueError) as error:
        raise ImageInputError(number, f"fetching {url} failed: {error}") from error
    if len(data) > max_bytes:
        raise ImageInputError(number, f"too large: {url} sends more than {max_bytes} bytes")
    return data


def _read_body(response: HTTPResponse, limit: int, deadline: float) -> bytes:
    """Up to `limit` bytes of the body, read as they arrive until `deadline` (monotonic s)."""
    data = bytearray()
    while len(data) < limit:
        chunk = response.read1(min(_CHUNK_BYTES, limit - len(data)))
        if not chunk:
            break
        data += chunk
        if time.monotonic() > deadline and len(data) < limit:
            raise _DeadlinePassed
    return bytes(data)
