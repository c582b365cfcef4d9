"""The remediator's PromQL: every expression parses, uses only metric names from the
exporter's catalogue (and ``up``), selects only the exporters' own series, and there is
a fixed number of them."""

from __future__ import annotations

import promql_parser
import pytest

from exporter.catalogue import CATALOGUE
from remediator.queries import REQUIRED_LABELS, Windows, expressions, verification_expressions


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


def test_every_query_parses_and_names_only_catalogue_metrics():
    for name, expr in expressions().items():
        names = metric_names(expr)
        assert names, name
        assert names <= {*CATALOGUE, "up"}, (name, names - set(CATALOGUE))
    for kind in ("cross_numa", "starved", "noisy_neighbour", "oversized"):
        for expr in verification_expressions(kind, ["a-1", "b-2"], "900s").values():
            assert metric_names(expr) <= set(CATALOGUE)


@pytest.mark.parametrize("selector", ['job="numaguard"', 'job="gpu-exporters",cluster="a"'])
def test_every_selector_reads_only_the_exporters_series(selector):
    expected = {tuple(m.strip().split("=", 1)) for m in selector.split(",")}
    queries = [
        *expressions(selector=selector).values(),
        *verification_expressions("cross_numa", ["a-1"], "60s", selector).values(),
    ]
    for expr in queries:
        for s in selectors(expr):
            have = {
                (m.name, f'"{m.value}"') for m in s.matchers.matchers if str(m.op).endswith("Equal")
            }
            assert expected <= have, (expr, s)


def test_the_number_of_queries_does_not_depend_on_anything():
    assert len(expressions()) == len(expressions(Windows("1m", "2h"))) == 22
    assert set(REQUIRED_LABELS) == set(expressions())


def test_verification_names_pods_by_uid_only():
    with pytest.raises(ValueError):
        verification_expressions("cross_numa", ['x"} or vector(1) or {a="'], "60s")
