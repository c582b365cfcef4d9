"""Signals: the remediator's fixed set of PromQL queries, evaluated through the Prometheus
HTTP API (aiohttp, with timeouts and retries), each answer turned into a pandas frame.

Anything doubtful — Prometheus down, slow, answering garbage or an error — raises
SignalsError: the cycle then takes no action at all.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp
import pandas as pd

from remediator.queries import Windows, expressions


class SignalsError(Exception):
    """The cycle's data cannot be trusted; ``reason`` names why, for the error counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # unreachable | timeout | http | garbage | query


@dataclass(frozen=True)
class Signals:
    """One cycle's answers: query name -> frame (label columns plus ``value``)."""

    at: float  # evaluation time, seconds since the epoch
    frames: dict[str, pd.DataFrame]

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]


class Prometheus:
    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        timeout: float = 10.0,
        retries: int = 2,
        windows: Windows = Windows(),
    ) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.retries = retries
        self.queries = expressions(windows)
        self.queries_made = 0  # stays len(queries) per cycle, whatever the cluster size

    async def fetch(self, at: float | None = None) -> Signals:
        at = time.time() if at is None else at
        names = list(self.queries)
        answers = await asyncio.gather(*(self.query(self.queries[n], at) for n in names))
        return Signals(at, dict(zip(names, answers, strict=True)))

    async def query(self, expr: str, at: float) -> pd.DataFrame:
        last: SignalsError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.2 * 2**attempt)
            try:
                return await self._query_once(expr, at)
            except SignalsError as err:
                last = err
                if err.reason in ("garbage", "query"):
                    break  # asking again will not make it sensible
        assert last is not None
        raise last

    async def _query_once(self, expr: str, at: float) -> pd.DataFrame:
        self.queries_made += 1
        try:
            async with self.session.post(
                f"{self.url}/api/v1/query",
                data={"query": expr, "time": f"{at:.3f}"},
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                if response.status >= 500 or response.status == 429:
                    raise SignalsError("http", f"{expr}: HTTP {response.status}")
                try:
                    body = await response.json(content_type=None)
                except ValueError as err:
                    raise SignalsError("garbage", f"{expr}: not JSON ({err})") from None
        except TimeoutError:
            raise SignalsError("timeout", f"{expr}: no answer in {self.timeout:g}s") from None
        except aiohttp.ClientError as err:
            raise SignalsError("unreachable", f"{self.url}: {err}") from None
        return frame(expr, body)


def frame(expr: str, body) -> pd.DataFrame:
    """An instant-query answer -> one row per series: its labels and ``value``."""
    if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
        raise SignalsError("garbage", f"{expr}: not a Prometheus answer")
    if body["status"] == "error":
        raise SignalsError("query", f"{expr}: {body.get('errorType')}: {body.get('error')}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise SignalsError("garbage", f"{expr}: expected a vector")
    rows = []
    for item in data.get("result", []):
        try:
            labels, (_, raw) = dict(item["metric"]), item["value"]
            value = float(raw)
        except (KeyError, TypeError, ValueError):
            raise SignalsError("garbage", f"{expr}: malformed sample {str(item)[:80]}") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise SignalsError("garbage", f"{expr}: malformed labels")
        if math.isnan(value):
            continue  # no number to act on
        labels.pop("__name__", None)
        labels["value"] = value
        rows.append(labels)
    if not rows:
        return pd.DataFrame({"value": pd.Series(dtype=float)})
    df = pd.DataFrame(rows)
    # Prometheus drops empty labels: a series without one had it empty
    labels = [c for c in df.columns if c != "value"]
    df[labels] = df[labels].fillna("")
    return df
