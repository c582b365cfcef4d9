"""PromQL as the tests read it: the metrics an expression selects, and the dashboards'
panel queries as Grafana sends them."""

from __future__ import annotations

import re

import promql_parser

from grafana import dashboards


def substituted(expr: str) -> str:
    """A panel query as Grafana sends it with every variable at its default: All, and
    the exporters' job; $__rate_interval as Grafana makes it for a 15 s scrape."""
    expr = expr.replace("$__rate_interval", "1m").replace("$job", "numaguard")
    return re.sub(r"\$(cluster|node|namespace|pod)\b", ".*", expr)


def panels():
    for d in dashboards.DASHBOARDS:
        for p in d.panels:
            yield d, p


def selectors(expr: str) -> list:
    """Every vector selector of a PromQL expression."""
    found = []

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
            child = getattr(node, attr, None)
            for c in child if isinstance(child, list) else [child]:
                if c is not None:
                    walk(c)

    walk(promql_parser.parse(expr))
    return found


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects."""
    return {s.name for s in selectors(expr)}
