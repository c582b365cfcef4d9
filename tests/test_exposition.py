"""Our renderer against prometheus_client's, on the same families: both formats must
parse to the same metadata and samples."""

from __future__ import annotations

import re

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter import catalogue as c
from exporter.collectors import host_numa, pods
from exporter.exposition import render
from simulator import presets
from tests.conftest import make_collection, metadata_of


class _Registry:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def as_client_families(families: list[c.Family]):
    """The same samples as prometheus_client metric families."""
    out = []
    for fam in families:
        spec = fam.spec
        labels = [c.NODE_LABEL, *spec.labels]
        if spec.kind == "counter":
            metric = CounterMetricFamily(
                spec.name.removesuffix("_total"), spec.help, labels=labels, unit=spec.unit
            )
        else:
            metric = GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=spec.unit)
        head = f'{spec.name}{{node="{fam.node}"'
        for line in fam.lines:
            labels, _, value = line[len(head) :].rstrip("\n").rpartition("} ")
            values = [fam.node] + [_unescape(v) for v in _values(labels)]
            metric.add_metric(values, float(value))
        out.append(metric)
    return out


def _values(text: str) -> list[str]:
    """Label values from our rendered ``,name="value"`` pairs."""
    values, i = [], 0
    while i < len(text):
        start = text.index('="', i) + 2
        j = start
        while text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        values.append(text[start:j])
        i = j + 1
    return values


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m[1], m[1]), value)


def parsed(families_iter):
    out = {}
    for fam in families_iter:
        out[fam.name] = (
            fam.documentation,
            fam.type,
            fam.unit,
            sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in fam.samples),
        )
    return out


async def test_same_exposition_as_prometheus_client(fake_root):
    host = presets.two_socket()
    host.pods[0].namespace = 'we"ird\\name\nspace'  # escaping must agree too
    root = fake_root(host)
    collection = make_collection(root, metadata=metadata_of(host))
    await collection.run_once()
    families = [*host_numa.families(collection.snapshot), *pods.families(collection.snapshot)]
    text, om = render(families)
    registry = _Registry(as_client_families(families))
    theirs_text = generate_latest(registry).decode()
    theirs_om = om_exposition.generate_latest(registry).decode()
    ours_text_parsed = parsed(parse_text(text.decode()))
    assert ours_text_parsed == parsed(parse_text(theirs_text))
    assert parsed(parse_om(om.decode())) == parsed(parse_om(theirs_om))
    assert any('we\\"ird\\\\name\\nspace' in line for line in text.decode().splitlines())
