"""Latency quantiles over several ``request_rollup_1m`` rows: the two aggregates, defined once.

A rollup row holds the exact quantiles (``p50_ms`` … ``p99_ms``) of one minute × model × GPU.
The quantile of a *union* of rows — several minutes, or one minute on several GPUs or
replicas on them — cannot be recovered from them: the rows keep no histogram. What can be said:

* The pooled quantile lies between the smallest and the largest of the rows' quantiles: at
  ``x = max(q_i)`` every row has at least the fraction ``q`` of its requests at or below ``x``,
  so the pooled set does too (up to the interpolation between two neighbouring requests that
  ``quantile_cont`` applies). The **max** is therefore an upper bound: when it is within an
  SLO, the pooled p99 is too. Use it for yes/no questions such as "did this model meet its SLO
  in this minute" — a minute counts as met only when every GPU serving the model met it, and
  no aggregation can make a breach on one GPU disappear.
* The **count-weighted mean** of the rows' quantiles is close to the pooled quantile when the
  rows share one distribution and otherwise lies between min and max, weighting busy rows
  more than quiet ones. It is a smoother estimate of the typical level, used where the value
  is plotted or compared before / after: multi-minute windows of
  :class:`store.source.StoreSource` and the victim's p99 around an action in the weekly
  report. It can sit below the SLO in a minute where one GPU breached it, so it must not
  decide "met".

Both are SQL aggregate expressions, to be used inside a ``GROUP BY`` over rollup rows.
"""

from __future__ import annotations

import re

from cotenant.core.errors import UsageError

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def _checked(column: str) -> str:
    # the expressions are spliced into SQL: only plain (optionally qualified) column names
    if not _IDENT.match(column):
        raise UsageError(f"not a column name: {column!r}")
    return column


def quantile_estimate_sql(column: str = "p99_ms", count: str = "count") -> str:
    """SQL for the count-weighted mean of ``column`` over the grouped rollup rows (weights
    ``count``, the rows' request counts): the smoother estimate of the pooled quantile, in
    the column's unit (ms). Null when the group holds no requests. Raises UsageError when an
    argument is not a plain column name."""
    q, n = _checked(column), _checked(count)
    return f"sum({q} * {n}) / sum({n})"


def quantile_upper_bound_sql(column: str = "p99_ms") -> str:
    """SQL for the max of ``column`` over the grouped rollup rows: an upper bound of the pooled
    quantile, the aggregate that decides whether an SLO was met. Raises UsageError when
    ``column`` is not a plain column name."""
    return f"max({_checked(column)})"
