"""`http(s)` image URLs, fetched with the standard library when the operator allows it."""

from __future__ import annotations

import urllib.error
import urllib.request

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


def fetch_url(url: str, *, number: int, max_bytes: int, timeout_seconds: float) -> bytes:
    """GET `url` and return its body of at most `max_bytes`.

    Args:
        timeout_seconds: limit on connecting and on each read (seconds).

    Raises:
        ImageInputError: a non-2xx status, a network error, a timeout, or a body larger
            than `max_bytes`.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "mlxcel"})
    try:
        with _OPENER.open(request, timeout=timeout_seconds) as response:
            data = response.read(max_bytes + 1)
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
