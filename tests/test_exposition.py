"""Our renderer against prometheus_client's, on the same families: both formats must
parse to the same metadata and samples."""

from __future__ import annotations

import re

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from numaguard.contract import catalogue as c
from numaguard.exporter import exposition
from numaguard.exporter.collectors import host_numa, pod_placement
from numaguard.exporter.exposition import Family, LabelPrefix, render
from numaguard.simulator.fakes import presets
from tests.conftest import make_collection, metadata_of, samples


class _Registry:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def as_client_families(families: list[Family]):
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
    families = [
        *host_numa.families(collection.snapshot),
        *pod_placement.families(collection.snapshot),
    ]
    text, om = render(families)
    # a family without a sample is left out (prometheus_client writes its HELP and TYPE)
    empty = [f.spec.name for f in families if not f.lines]
    assert empty and not [n for n in empty if f"# TYPE {n} " in text.decode()]
    registry = _Registry(as_client_families([f for f in families if f.lines]))
    theirs_text = generate_latest(registry).decode()
    theirs_om = om_exposition.generate_latest(registry).decode()
    ours_text_parsed = parsed(parse_text(text.decode()))
    assert ours_text_parsed == parsed(parse_text(theirs_text))
    assert parsed(parse_om(om.decode())) == parsed(parse_om(theirs_om))
    assert any('we\\"ird\\\\name\\nspace' in line for line in text.decode().splitlines())
    # the tests' fast sample reader reads what prometheus_client's parser reads
    theirs = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in parse_text(collection.exposition.text.decode())
        for s in family.samples
    }
    assert samples(collection.exposition.text) == theirs
    assert len(theirs) > 100


def test_series_lines_rendered_once_are_the_same_as_rendered_afresh():
    """A series' line up to its value is looked up from the last cycle's: the lines are
    the same as those of a family rendered from nothing, whatever came and went, and
    only this cycle's series are remembered."""

    def fill(pods: list[str], value: float) -> Family:
        fam = Family(c.CONTAINER_CPUS, "node-a")
        for pod in pods:
            prefix = LabelPrefix(c.CONTAINER, ("ns", pod, "main", f"uid-{pod}", "cid"))
            for numa in ("0", "1"):
                fam.add_under(prefix, value, numa)
        return fam

    fill(["a", "b"], 1)
    second = fill(["b", "c"], 2.5)
    exposition._HEADS.clear()
    afresh = fill(["b", "c"], 2.5)
    assert second.lines == afresh.lines
    assert second.lines[0] == (
        'numaguard_container_cpus{node="node-a",namespace="ns",pod="b",container="main",'
        'pod_uid="uid-b",container_id="cid",numa_node="0"} 2.5\n'
    )
    remembered = exposition._HEADS[(c.CONTAINER_CPUS.name, "node-a")]
    assert len(remembered) == 4 and not [k for k in remembered if "a" in k[0]]
