"""Calls to a running cotenant's HTTP API, for commands given ``--url`` (a DuckDB file has one
writer process, so while ``cotenant serve`` runs other commands go through its API)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cotenant.core.errors import CotenantError, SourceError


def api_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``Authorization`` header of the read token, where the command's environment has
    one (``COTENANT_AUTH_TOKEN``, else the file ``COTENANT_AUTH_TOKEN_FILE`` names: the same
    variables serve reads from); none otherwise."""
    from cotenant.actuators.backends.factory import read_secret

    env = os.environ if env is None else env
    token = read_secret(
        env.get("COTENANT_AUTH_TOKEN", ""),
        env.get("COTENANT_AUTH_TOKEN_FILE", ""),
        "auth.token_file (from COTENANT_AUTH_TOKEN_FILE)",
    )
    return {"Authorization": f"Bearer {token}"} if token else {}


def call_api(
    url: str, path: str, *, body: dict[str, Any] | None = None, timeout_s: float = 60.0
) -> dict[str, Any]:
    """GET ``path`` (POST ``body`` as JSON when given) on the cotenant at ``url``, with the
    read token of :func:`api_headers`; its JSON answer. Raises SourceError when it cannot be
    reached or does not answer within ``timeout_s``, and CotenantError with its message for
    any answer other than 200."""
    import httpx

    target = url.rstrip("/") + path
    headers = api_headers()
    try:
        if body is None:
            r = httpx.get(target, timeout=timeout_s, headers=headers)
        else:
            r = httpx.post(target, json=body, timeout=timeout_s, headers=headers)
    except httpx.TimeoutException as exc:
        raise SourceError(
            f"cotenant at {url} did not answer {path} within {timeout_s:g} s: it may still be "
            "working on it (a fleet's weekly report reads Prometheus first); wait longer",
            url=url,
        ) from exc
    except httpx.HTTPError as exc:
        raise SourceError(
            f"cannot reach cotenant at {url}: {exc} (is it running?)", url=url
        ) from exc
    if r.status_code != 200:
        try:
            msg = r.json().get("error") or r.text
        except ValueError:
            msg = r.text
        raise CotenantError(f"{url} answered {r.status_code}: {msg}")
    out: dict[str, Any] = r.json()
    return out
