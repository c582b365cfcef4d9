"""A cycle's answers (pure): query name -> frame, as the signals source decoded them; what
findings, evidence, capacity and the planner read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from numaguard.remediator.core.queries import REQUIRED_LABELS


@dataclass(frozen=True)
class Signals:
    """One cycle's answers: query name -> frame (label columns plus ``value``)."""

    at: float  # evaluation time, seconds since the epoch
    frames: dict[str, pd.DataFrame]
    dropped: Counter = field(default_factory=Counter)  # (query, reason) -> rows dropped

    def __getitem__(self, name: str) -> pd.DataFrame:
        """A query not asked this cycle answered nothing."""
        found = self.frames.get(name)
        return empty_frame(REQUIRED_LABELS.get(name, ())) if found is None else found


def merged(*parts: Signals) -> Signals:
    """The answers of several rounds as one: frames of the same name joined, a series
    asked twice (in two rounds, or two overlapping batches) kept once."""
    frames: dict[str, list[pd.DataFrame]] = {}
    dropped: Counter = Counter()
    for part in parts:
        dropped.update(part.dropped)
        for name, df in part.frames.items():
            frames.setdefault(name, []).append(df)
    return Signals(parts[0].at, {n: joined(dfs) for n, dfs in frames.items()}, dropped)


def joined(dfs: list[pd.DataFrame]) -> pd.DataFrame:
    dfs = [df for df in dfs if not df.empty] or dfs[:1]
    if len(dfs) == 1:
        return dfs[0]
    df = pd.concat(dfs, ignore_index=True)
    labels = [c for c in df.columns if c != "value"]
    df[labels] = df[labels].fillna("")
    return df.drop_duplicates(labels, ignore_index=True)


def empty_frame(labels: tuple[str, ...]) -> pd.DataFrame:
    columns = {name: pd.Series(dtype=object) for name in labels}
    return pd.DataFrame({**columns, "value": pd.Series(dtype=float)})
