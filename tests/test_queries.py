"""The remediator's PromQL: every expression parses, uses only metric names from the
exporter's catalogue, and there is a fixed number of them."""

from __future__ import annotations

import promql_parser

from exporter.catalogue import CATALOGUE
from remediator.queries import Windows, expressions


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects."""
    found = set()

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.add(node.name)
        for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
            child = getattr(node, attr, None)
            for c in child if isinstance(child, list) else [child]:
                if c is not None:
                    walk(c)

    walk(promql_parser.parse(expr))
    return found


def test_every_query_parses_and_names_only_catalogue_metrics():
    for name, expr in expressions().items():
        names = metric_names(expr)
        assert names, name
        assert names <= set(CATALOGUE), (name, names - set(CATALOGUE))


def test_the_number_of_queries_does_not_depend_on_anything():
    assert len(expressions()) == len(expressions(Windows("1m", "2h"))) == 17
