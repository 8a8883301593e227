"""Calls to a running cotenant's HTTP API, for commands given ``--url`` (a DuckDB file has one
writer process, so while ``cotenant serve`` runs other commands go through its API)."""

from __future__ import annotations

from typing import Any

from cotenant.core.errors import CotenantError, SourceError


def call_api(
    url: str, path: str, *, body: dict[str, Any] | None = None, timeout_s: float = 60.0
) -> dict[str, Any]:
    """GET ``path`` (POST ``body`` as JSON when given) on the cotenant at ``url``; its JSON
    answer. Raises SourceError when it cannot be reached or does not answer within
    ``timeout_s``, and CotenantError with its message for any answer other than 200."""
    import httpx

    target = url.rstrip("/") + path
    try:
        if body is None:
            r = httpx.get(target, timeout=timeout_s)
        else:
            r = httpx.post(target, json=body, timeout=timeout_s)
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
