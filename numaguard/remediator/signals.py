"""Signals: the remediator's PromQL queries, evaluated through the Prometheus HTTP API
(aiohttp, with timeouts and retries), each answer turned into a pandas frame.

Anything doubtful about an answer as a whole — Prometheus down, slow, answering garbage,
an error, or a cycle's answers over ``max_answer_bytes`` together — raises SignalsError:
the cycle then takes no action at all. Doubtful rows (a label missing, a value that is
not a finite, non-negative number, a pod uid, node or device that is no name, a series
answered twice) are dropped and counted: they cost only themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

import aiohttp
import pandas as pd
import promql_parser
from pydantic import AfterValidator, Field, StringConstraints

from numaguard.remediator.core.answers import Signals, empty_frame, joined
from numaguard.remediator.core.queries import (
    DEFAULT_SELECTOR,
    MATCHED,
    RECORDED,
    REQUIRED_LABELS,
    RULES_EVALUATED,
    Queries,
    Windows,
    expressions,
    quotable,
    rules_evaluated,
)
from numaguard.remediator.core.validation import FORBID_EXTRA, Positive

log = logging.getLogger(__name__)
# label matchers, as PromQL writes them between braces: job="numaguard",cluster=~"gpu-.*"
_MATCHER = r'\s*[A-Za-z_]\w*\s*(=|!=|=~|!~)\s*"[^"\\]*"\s*'
_MATCHERS = rf"^{_MATCHER}(,{_MATCHER})*$"


def _matchers(text: str) -> str:
    if re.fullmatch(_MATCHERS, text):
        return text
    quoted = re.sub(r'(=~|!~|!=|=)\s*([^",]+?)\s*(?=,|$)', r'\1"\2"', text)
    hint = f": quote each value, {quoted}" if re.fullmatch(_MATCHERS, quoted) else ""
    raise ValueError(
        f'label matchers as PromQL writes them between braces, e.g. job="numaguard"{hint}'
    )


@dataclass(frozen=True)
class Source:
    """Where the exporters' series are read, and how much of an answer is believed."""

    __pydantic_config__ = FORBID_EXTRA

    # the exporters' own series: the ServiceMonitor's job (the alert rules use the same)
    selector: Annotated[str, StringConstraints(strict=True), AfterValidator(_matchers)] = (
        DEFAULT_SELECTOR
    )
    # in a view of several clusters (Thanos, Mimir): the value of the `cluster` label of
    # the one this remediator acts on; every query selects it
    cluster: Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9._:/-]*$")] = ""
    timeout_seconds: Positive = 10.0  # per query, reading and decoding included
    # all of a cycle's answers together: what decoding them costs in memory is bounded
    # (about six times this at most)
    max_answer_bytes: Annotated[int, Field(gt=0, strict=True)] = 32 << 20


class SignalsError(Exception):
    """The cycle's data cannot be trusted; ``reason`` names why, for the error counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        # unreachable | timeout | http | garbage | query | answer_too_large | partial
        self.reason, self.detail = reason, detail


class Prometheus:
    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        source: Source = Source(),
        retries: int = 2,
        windows: Windows = Windows(),
    ) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = source.timeout_seconds
        self.retries = retries
        self.selector = scope(source)
        # what the recording rules select: alerts/ writes them per exporter job, and each
        # Prometheus (a shard, a replica) evaluates them over its own series; a view of
        # several clusters tells their records apart by the cluster label, as any series
        self.rule_selector = source.selector
        self.cluster = source.cluster
        self.max_answer_bytes = source.max_answer_bytes
        self.windows = windows
        self.queries = expressions(windows, self.selector)  # the whole set, unscoped
        self.queries_made = 0
        self.bytes_read = 0  # answers' bytes, all queries together: for the benchmarks
        self.rows_read = 0
        self._unrecorded: list[str] = []  # the recording rules last found missing

    async def fetch(self, at: float | None = None) -> Signals:
        """The whole set, unscoped: every pod, slice and zone of the cluster."""
        return await self.fetch_set(self.queries, REQUIRED_LABELS, at)

    async def fetch_set(
        self,
        queries: dict[str, str] | Queries,
        required: dict[str, tuple[str, ...]] = REQUIRED_LABELS,
        at: float | None = None,
        budget: list[int] | None = None,
    ) -> Signals:
        """``budget``: the bytes the answers may still take, shared with other sets (the
        cycle's rounds); a fresh ``max_answer_bytes`` when not given."""
        at = time.time() if at is None else at
        pairs = list(queries.items()) if isinstance(queries, dict) else list(queries)
        budget = [self.max_answer_bytes] if budget is None else budget
        answers = await asyncio.gather(
            *(self.query(expr, at, required.get(name, ()), budget) for name, expr in pairs)
        )
        parts, dropped = {}, Counter()
        for (name, _), (df, lost) in zip(pairs, answers, strict=True):
            parts.setdefault(name, []).append(df)
            dropped.update({(name, reason): n for reason, n in lost.items()})
            self.rows_read += len(df)
        return Signals(at, {n: joined(dfs) for n, dfs in parts.items()}, dropped)

    async def recorded(self, at: float) -> frozenset[str]:
        """The expressions Prometheus records as the remediator would write them, and
        evaluated lately without error, for this cluster: reading their records costs a
        lookup instead of a window function over every pod. Anything else — no such
        rule, another expression, windows or selector, a failing or late rule group, no
        sign that this cluster's servers evaluate it, an answer not understood — and
        they are evaluated directly."""
        wanted = expressions(self.windows, self.rule_selector)
        normal = {RECORDED[n]: str(promql_parser.parse(wanted[n])) for n in RECORDED}
        normal[RULES_EVALUATED] = str(promql_parser.parse(rules_evaluated(self.rule_selector)))
        params = [("type", "record"), *(("rule_name[]", r) for r in normal)]
        try:
            async with self.session.get(
                f"{self.url}/api/v1/rules",
                params=params,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                body = await response.json() if response.status == 200 else {}
            groups = body["data"]["groups"]
            found, interval = set(), 0.0
            for group in groups:
                evaluated = datetime.fromisoformat(group["lastEvaluation"]).timestamp()
                late = at - evaluated > 2 * float(group["interval"])
                for rule in group["rules"]:
                    query = normal.get(rule.get("name"))
                    if (
                        query is not None
                        and not late
                        and rule.get("health") == "ok"
                        and str(promql_parser.parse(rule["query"])) == query
                    ):
                        found.add(rule["name"])
                        if rule["name"] == RULES_EVALUATED:
                            interval = max(interval, float(group["interval"]))
            here = RULES_EVALUATED in found and await self._evaluated_here(at, 2 * interval)
        except (
            aiohttp.ClientError,
            TimeoutError,
            ValueError,
            KeyError,
            TypeError,
            SignalsError,
        ) as err:
            log.info("recording rules not read (%s): evaluating directly", err)
            return frozenset()
        if not here:  # another cluster's servers evaluate them, or none lately
            found = set()
        missing = sorted(RECORDED[n] for n in RECORDED if RECORDED[n] not in found)
        if missing and missing != self._unrecorded:  # said once, and again when it changes
            log.info(
                "evaluating directly: no healthy, current recording rule as the remediator "
                "would write it%s for %s",
                f" evaluated for cluster {self.cluster}" if self.cluster else "",
                ", ".join(missing),
                extra={"rules": missing, "cluster": self.cluster},
            )
        self._unrecorded = missing
        return frozenset(n for n in RECORDED if RECORDED[n] in found)

    async def _evaluated_here(self, at: float, max_age: float) -> bool:
        """Whether this cluster's servers wrote the rules' witness record within
        ``max_age`` seconds of ``at``."""
        cluster = f'{{cluster="{self.cluster}"}}' if self.cluster else ""
        age = f"time() - timestamp({RULES_EVALUATED}{cluster})"
        df, _ = await self.query(age, at)
        return bool(len(df)) and float(df["value"].min()) <= max_age

    async def query(
        self,
        expr: str,
        at: float,
        required: tuple[str, ...] = (),
        budget: list[int] | None = None,
    ) -> tuple[pd.DataFrame, Counter]:
        """One query's frame and dropped rows, read and decoded within the timeout;
        ``budget``: the bytes its set of answers may still take."""
        budget = [self.max_answer_bytes] if budget is None else budget
        last: SignalsError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.2 * 2**attempt)
            try:
                return await asyncio.wait_for(
                    self._query_once(expr, at, required, budget), self.timeout
                )
            except TimeoutError:
                last = SignalsError("timeout", f"{expr}: no answer in {self.timeout:g}s")
            except SignalsError as err:
                last = err
                if err.reason in ("garbage", "query", "answer_too_large"):
                    break  # asking again will not make it sensible
        assert last is not None
        raise last

    async def _query_once(self, expr: str, at: float, required: tuple[str, ...], budget: list[int]):
        """The read is bounded by what the budget has left; the decoding runs off the
        event loop."""
        self.queries_made += 1
        try:
            url = f"{self.url}/api/v1/query"
            async with self.session.post(url, data=_form(expr, at)) as response:
                if response.status >= 500 or response.status == 429:
                    raise SignalsError("http", f"{expr}: HTTP {response.status}")
                if (response.content_length or 0) > budget[0]:
                    raise _too_large(expr, self.max_answer_bytes)
                raw = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    raw += chunk
                    if len(raw) > budget[0]:
                        raise _too_large(expr, self.max_answer_bytes)
        except aiohttp.ClientError as err:
            raise SignalsError("unreachable", f"{self.url}: {err}") from None
        if len(raw) > budget[0]:  # answers read meanwhile took the rest
            raise _too_large(expr, self.max_answer_bytes)
        budget[0] -= len(raw)
        self.bytes_read += len(raw)
        return await asyncio.to_thread(_decode, expr, bytes(raw), required)


def scope(source: Source) -> str:
    """The matchers every query's exporter series carry: the selector, and the cluster."""
    cluster = f',cluster="{source.cluster}"' if source.cluster else ""
    return source.selector + cluster


def _form(expr: str, at: float) -> dict[str, str]:
    """An instant query's form. Thanos and Cortex-like engines are asked for the whole
    answer or an error (a store, shard or replica set that did not answer is no smaller
    cluster), and for HA replicas' series once; Prometheus ignores both."""
    return {"query": expr, "time": f"{at:.3f}", "partial_response": "false", "dedup": "true"}


def _decode(expr: str, raw: bytes, required: tuple[str, ...]) -> tuple[pd.DataFrame, Counter]:
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise SignalsError("garbage", f"{expr}: not JSON ({err})") from None
    except RecursionError:  # nested deeper than any answer Prometheus writes
        raise SignalsError("garbage", f"{expr}: JSON nested too deep") from None
    return frame(expr, body, required)


def _too_large(expr: str, limit: int) -> SignalsError:
    return SignalsError("answer_too_large", f"{expr}: the cycle's answers are over {limit} bytes")


def frame(expr: str, body, required: tuple[str, ...] = ()) -> tuple[pd.DataFrame, Counter]:
    """An instant-query answer -> one row per series: its labels and ``value``; and the
    rows dropped, by reason (missing_label, bad_value, bad_label, duplicate: every row of
    a series answered more than once)."""
    if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
        raise SignalsError("garbage", f"{expr}: not a Prometheus answer")
    if body["status"] == "error":
        raise SignalsError("query", f"{expr}: {body.get('errorType')}: {body.get('error')}")
    if body.get("warnings"):  # e.g. Thanos: a store that did not answer; never a whole view
        raise SignalsError("partial", f"{expr}: {'; '.join(map(str, body['warnings']))[:500]}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise SignalsError("garbage", f"{expr}: expected a vector")
    result = data.get("result")
    if not isinstance(result, list):
        raise SignalsError("garbage", f"{expr}: no result list")
    rows, dropped, keys = [], Counter(), Counter()
    for item in result:
        try:
            labels, (_, raw) = dict(item["metric"]), item["value"]
        except (KeyError, TypeError, ValueError):
            raise SignalsError("garbage", f"{expr}: malformed sample {str(item)[:80]}") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise SignalsError("garbage", f"{expr}: malformed labels")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            dropped["bad_value"] += 1  # no number to act on (ages, sizes, counts: all >= 0)
            continue
        if not all(labels.get(name) for name in required):
            dropped["missing_label"] += 1
            continue
        if not all(quotable(labels[name]) for name in MATCHED if labels.get(name)):
            dropped["bad_label"] += 1  # a newline, a quote: no exporter writes it
            continue
        key = frozenset(labels.items())
        keys[key] += 1
        labels.pop("__name__", None)
        labels["value"] = value
        rows.append((key, labels))
    # Prometheus answers one sample per series: a second was not written by it
    rows = [labels for key, labels in rows if keys[key] == 1]
    if duplicates := sum(n for n in keys.values() if n > 1):
        dropped["duplicate"] += duplicates
    if not rows:
        return empty_frame(required), dropped
    df = pd.DataFrame(rows)
    # Prometheus drops empty labels: a series without one had it empty
    labels = [c for c in df.columns if c != "value"]
    df[labels] = df[labels].fillna("")
    return df, dropped
