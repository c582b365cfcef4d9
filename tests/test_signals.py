"""The remediator's signals: its fixed queries against a real Prometheus scraping the
exporter on the simulated GPU node, and a Prometheus that is down, slow, failing or
answering garbage (no frames, a named reason, never a partial answer)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pydantic
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from numaguard.remediator.core import queries as q
from numaguard.remediator.core.kinds import CROSS_NUMA, STARVED
from numaguard.remediator.core.queries import Windows, expressions
from numaguard.remediator.signals import Prometheus, SignalsError, Source, frame
from numaguard.simulator.cluster.simulated import one_node
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import PrometheusServer
from tests.conftest import examples

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]


async def test_signals_from_a_real_prometheus(control_plane):
    host, nvml = presets.gpu_node()
    async with (
        one_node(control_plane, host, nvml) as (_, url),
        PrometheusServer([url.removeprefix("http://")], free_port()) as prom,
    ):
        await prom.wait_for("numaguard_gpu_starved == 1")
        windows = Windows("3s", "3s")
        e = expressions(windows)
        for name in (CROSS_NUMA.sustained, STARVED.sustained, "slice_sm"):
            await prom.wait_for(e[name])  # until a whole window of scrapes says so
        async with aiohttp.ClientSession() as session:
            client = Prometheus(prom.url, session, windows=windows)
            s = await client.fetch()
            assert client.queries_made == len(client.queries)
    assert abs(s.at - time.time()) < 60
    cross = s["cross_numa_sustained"]
    assert set(zip(cross["pod"], cross["reason"], strict=True)) == {
        ("trainer-remote", "device_remote")
    }
    starved = s["starved_sustained"]
    assert set(zip(starved["pod"], starved["reason"], strict=True)) == {
        ("trainer-remote", "device_remote")
    }
    sm = s["slice_sm"].set_index("mig_uuid")["value"]
    assert sm[nvml.gpus[1].mig[0].uuid] == pytest.approx(0.6, abs=1e-6)
    free = s["zone_free_devices"]
    gpus_free = free[free["resource"] == "nvidia.com/gpu"].set_index("numa_node")["value"]
    assert dict(gpus_free) == {"0": 1.0, "1": 1.0}
    need = s["pod_exclusive_cpus"].groupby("pod")["value"].sum()
    assert need["trainer"] == 8 and need["infer-a"] == 2
    assert "notebook-0" not in need.index  # the shared pool is not exclusive
    assert set(s["collector_success"]["collector"]) >= {"gpu", "pod_resources"}


class BadPrometheus:
    def __init__(self) -> None:
        self.mode = "garbage"
        self.hits = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.form = dict(await request.post())
        if self.mode == "slow":
            await asyncio.sleep(2)
        if self.mode == "500":
            return web.Response(status=500, text="internal error")
        if self.mode == "html":
            return web.Response(text="<html>proxy error</html>", content_type="text/html")
        if self.mode == "error":
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            )
        if self.mode == "partial":  # Thanos, a store down, partial responses allowed
            rows = [{"metric": {"node": "n1"}, "value": [1, "1"]}]
            return web.json_response(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": rows},
                    "warnings": ['fetch series for {cluster="a"}: connection refused'],
                }
            )
        if self.mode == "matrix":
            return web.json_response({"status": "success", "data": {"resultType": "matrix"}})
        if self.mode == "medium":  # about 45 kB
            rows = [{"metric": {"node": f"n{i}"}, "value": [1, "1"]} for i in range(1000)]
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": rows}}
            )
        if self.mode == "huge":
            rows = [{"metric": {"node": f"n{i}"}, "value": [1, "1"]} for i in range(20_000)]
            return web.json_response(
                {"status": "success", "data": {"resultType": "vector", "result": rows}}
            )
        if self.mode == "deep":  # nested past what the decoder can follow
            return web.Response(text="[" * 40_000 + "]" * 40_000)
        if self.mode == "bad_value":
            body = {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [{"metric": {"node": "n1"}, "value": [1, "not-a-number"]}],
                },
            }
            return web.json_response(body)
        return web.Response(text=json.dumps({"unexpected": True}))


@pytest.fixture
async def bad_prometheus():
    """A BadPrometheus on a loopback port: (it, its URL)."""
    bad = BadPrometheus()
    app = web.Application()
    app.router.add_post("/api/v1/query", bad.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield bad, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("mode", "reason", "attempts"),
    [
        ("slow", "timeout", 2),
        ("500", "http", 2),
        ("html", "garbage", 1),
        ("error", "query", 1),
        ("matrix", "garbage", 1),
        ("deep", "garbage", 1),
        ("garbage", "garbage", 1),
        ("huge", "answer_too_large", 1),
        ("partial", "partial", 2),
    ],
)
async def test_a_bad_prometheus_gives_no_signals(bad_prometheus, mode, reason, attempts):
    bad, url = bad_prometheus
    bad.mode = mode
    async with aiohttp.ClientSession() as session:
        limits = Source(timeout_seconds=0.5, max_answer_bytes=100_000)
        client = Prometheus(url, session, limits, retries=1)
        with pytest.raises(SignalsError) as err:
            await client.query("up", time.time())
    assert err.value.reason == reason
    assert bad.hits == attempts  # retried only what a retry can fix
    # asked, of engines over many servers (Thanos), for the whole answer and HA pairs once
    assert bad.form["partial_response"] == "false" and bad.form["dedup"] == "true"


async def test_the_cluster_scopes_every_query(bad_prometheus):
    bad, url = bad_prometheus
    bad.mode = "medium"
    async with aiohttp.ClientSession() as session:
        client = Prometheus(url, session, Source(cluster="gpu-east"), retries=0)
        assert client.selector == 'job="numaguard",cluster="gpu-east"'
        await client.query(client.queries[CROSS_NUMA.seen], time.time())
    assert 'numaguard_pod_cross_numa{job="numaguard",cluster="gpu-east"}' in bad.form["query"]
    # as the configuration is read: a value no matcher can quote is refused
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(Source).validate_python({"cluster": 'east"} or vector(1) #'})


async def test_a_value_that_is_no_number_costs_only_its_row(bad_prometheus):
    bad, url = bad_prometheus
    bad.mode = "bad_value"
    async with aiohttp.ClientSession() as session:
        client = Prometheus(url, session, retries=0)
        got = await client.fetch_set({"a": "up"}, {"a": ("node",)}, time.time())
    assert got["a"].empty
    assert got.dropped == {("a", "bad_value"): 1}


async def test_prometheus_down():
    async with aiohttp.ClientSession() as session:
        client = Prometheus(f"http://127.0.0.1:{free_port()}", session, retries=0)
        with pytest.raises(SignalsError) as err:
            await client.fetch()
    assert err.value.reason == "unreachable"


def test_empty_answers_and_bad_rows():
    empty, dropped = frame(
        "x", {"status": "success", "data": {"resultType": "vector", "result": []}}, ("node",)
    )
    assert empty.empty and list(empty.columns) == ["node", "value"] and not dropped
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "m", "node": "a"}, "value": [1, "NaN"]},
                {"metric": {"node": "b"}, "value": [1, "2.5"]},
                {"metric": {"node": "c"}, "value": [1, "-Inf"]},
                {"metric": {"node": "d"}, "value": [1, "+Inf"]},
                {"metric": {"node": "e"}, "value": [1, "-1e308"]},
                {"metric": {"pod": "f"}, "value": [1, "1"]},  # no node
                {"metric": {"node": ""}, "value": [1, "1"]},  # empty is absent
                {"metric": {"node": "g"}, "value": [1, "one"]},
                {"metric": {"node": "h", "pod_uid": "u\n1"}, "value": [1, "1"]},
                {"metric": {"node": 'i"} or vector(1) #'}, "value": [1, "1"]},
                # one series answered twice (Prometheus never does): neither copy is read
                {"metric": {"node": "j", "pod": "p"}, "value": [1, "1"]},
                {"metric": {"pod": "p", "node": "j"}, "value": [1, "0"]},
                {"metric": {"node": "j", "pod": "q"}, "value": [1, "1"]},
            ],
        },
    }
    df, dropped = frame("x", body, ("node",))
    assert df.to_dict("records") == [
        {"node": "b", "value": 2.5, "pod": ""},
        {"node": "j", "pod": "q", "value": 1.0},
    ]
    assert dropped == {"bad_value": 5, "missing_label": 2, "bad_label": 2, "duplicate": 2}


async def test_the_answers_of_a_cycle_share_one_bound(bad_prometheus):
    bad, url = bad_prometheus
    bad.mode = "medium"
    async with aiohttp.ClientSession() as session:
        client = Prometheus(url, session, Source(max_answer_bytes=100_000), retries=0)
        one = await client.fetch_set({"a": "up"}, {}, time.time())  # one fits
        assert len(one["a"]) == 1000
        with pytest.raises(SignalsError) as err:  # three do not
            await client.fetch_set({"a": "up", "b": "up", "c": "up"}, {}, time.time())
    assert err.value.reason == "answer_too_large"


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    result=st.lists(
        st.fixed_dictionaries({"metric": JSON, "value": JSON})
        | st.fixed_dictionaries(
            {
                "metric": st.dictionaries(
                    st.sampled_from([*q.MATCHED, "__name__"]),
                    st.sampled_from(["n1", "uid-1", "MIG-1/2/0"]) | st.text(max_size=4),
                ),
                "value": st.tuples(
                    st.floats(), st.sampled_from(["1", "NaN", "-Inf", "x", "1e999", ""])
                ),
            }
        )
        | JSON,
        max_size=5,
    )
)
def test_any_answer_is_a_frame_or_a_named_error(result):
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    try:
        df, dropped = frame("x", body, ("node",))
    except SignalsError as err:
        assert err.reason == "garbage"
        return
    assert "node" in df.columns
    assert all(v >= 0 and v == v and v != float("inf") for v in df["value"])
    assert len(df) + sum(dropped.values()) == len(result)
    for label in q.MATCHED:  # whatever is left, a later round can select by
        if label in df.columns:
            q.scoped(["holders"], label, set(df[label]) - {""}, q.Windows(), q.DEFAULT_SELECTOR)
