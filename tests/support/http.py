"""HTTP as the console's tests speak it: a GET whose status, headers and body come back
whatever the status."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

HTTP_TIMEOUT_S = 30.0


def get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()
