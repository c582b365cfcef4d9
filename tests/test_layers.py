"""The house's layers, held by reading every product module's imports: readers import
nothing of ours but their own package; records only readers; the model, the collectors
and the rendering no source; the remediator's pure core no client library; no product
module the simulator; and only the actuator writes to the API server."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """The folders are the import paths: numaguard/exporter/model.py is
    numaguard.exporter.model."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


PRODUCT = {
    module_name(p): p
    for p in sorted((ROOT / "numaguard").rglob("*.py"))
    if "_pb2" not in p.name and not module_name(p).startswith("numaguard.simulator")
}


def imports(source: str) -> set[str]:
    """Every module a source imports (``from a import b`` counts as a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


# (modules the rule covers, what they must not import, except what they may)
RULES = [
    # the contract both halves agree on imports nothing of theirs; what both run, only it
    ("numaguard.contract", ("numaguard.",), ("numaguard.contract",)),
    ("numaguard.common", ("numaguard.",), ("numaguard.common", "numaguard.contract")),
    # the two halves never import each other: what they share is the contract's
    ("numaguard.exporter", ("numaguard.remediator",), ()),
    ("numaguard.remediator", ("numaguard.exporter",), ()),
    (
        "numaguard.exporter.readers",
        ("numaguard.",),
        ("numaguard.exporter.readers",),
    ),
    ("numaguard.exporter.records", ("numaguard.",), ("numaguard.exporter.readers",)),
    (
        (
            "numaguard.exporter.model",
            "numaguard.exporter.collectors",
            "numaguard.exporter.exposition",
            "numaguard.contract.catalogue",
            "numaguard.exporter.publishers.nrt_object",
        ),
        ("numaguard.exporter.sources",),
        (),
    ),
    # the remediator's pure core, by prefix: a new module there is held to it too
    (
        "numaguard.remediator.core",
        ("aiohttp", "kubernetes", "numaguard.remediator."),
        ("numaguard.remediator.core",),
    ),
    ("numaguard", ("numaguard.simulator", "simulator"), ()),
    # the Kubernetes client is wrapped once: no typed API (create_*, patch_*) elsewhere
    ("numaguard", ("kubernetes",), ()),
]
# the module that wraps the client, and the package that checks its extra is installed
CLIENT = ("numaguard.remediator.kube", "numaguard.remediator")
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def broken(module: str, imported: set[str]) -> list[str]:
    out = []
    for covered, forbidden, allowed in RULES:
        if module in CLIENT and forbidden == ("kubernetes",):
            continue
        covered = (covered,) if isinstance(covered, str) else covered
        if not any(module == c or module.startswith(c + ".") for c in covered):
            continue
        for name in imported:
            if any(name == f.rstrip(".") or name.startswith(f) for f in forbidden) and not any(
                name == a or name.startswith(a + ".") for a in allowed
            ):
                out.append(name)
    return sorted(set(out))


@pytest.mark.parametrize("module", sorted(PRODUCT))
def test_each_module_keeps_to_its_layer(module):
    assert broken(module, imports(PRODUCT[module].read_text())) == []


def test_a_forbidden_import_is_caught():
    assert broken("numaguard.exporter.model", {"numaguard.exporter.sources.gpu"}) == [
        "numaguard.exporter.sources.gpu"
    ]
    assert broken("numaguard.exporter.readers.cgroup", {"numaguard.exporter.model"}) == [
        "numaguard.exporter.model"
    ]
    assert broken("numaguard.exporter.server", {"numaguard.simulator.fakes.nvml"}) == [
        "numaguard.simulator.fakes.nvml"
    ]
    assert broken("numaguard.remediator.core.planner", {"kubernetes.aio"}) == ["kubernetes.aio"]
    assert broken("numaguard.remediator.core.new", {"numaguard.remediator.signals"}) == [
        "numaguard.remediator.signals"
    ]
    assert broken("numaguard.remediator.core.new", {"numaguard.remediator.core.kinds"}) == []
    assert broken("numaguard.exporter.readers.cgroup", {"numaguard.exporter.readers"}) == []
    assert broken("numaguard.remediator.core.kinds", {"numaguard.exporter.catalogue"}) == [
        "numaguard.exporter.catalogue"
    ]
    assert broken("numaguard.exporter.collection", {"numaguard.remediator.metrics"}) == [
        "numaguard.remediator.metrics"
    ]
    assert broken("numaguard.contract.catalogue", {"numaguard.exporter.model"}) == [
        "numaguard.exporter.model"
    ]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module -> the modules of ``modules`` it imports, anywhere in it: at the top, in
    a function, or for type checking alone (an import circle closed only by a type is
    still a record in the wrong file). A package counts as the module it names."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {m for name in imports(path.read_text()) if (m := known(name))} - {module}
        for module, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of more than one
    module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            part = []
            while not part or part[-1] != module:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_product_module_imports_itself_round_a_circle():
    assert circles(import_graph(PRODUCT)) == []


def test_a_circle_closed_by_a_type_alone_is_caught(tmp_path):
    (tmp_path / "a.py").write_text("from p.b import B\nclass A: ...\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.c import C\nB = 1\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from p.a import A\n")
    (tmp_path / "d.py").write_text("import p.a\n")
    planted = {f"p.{m}": tmp_path / f"{m}.py" for m in "abcd"}
    assert circles(import_graph(planted)) == [["p.a", "p.b", "p.c"]]


def test_no_test_module_imports_another():
    """What tests share lives in tests/helpers/: a test module imported by another runs
    its fixtures and marks twice, and hides who depends on what."""
    importing = {
        path.name: sorted(n for n in imports(path.read_text()) if n.startswith("tests.test_"))
        for path in sorted((ROOT / "tests").glob("*.py"))
    }
    assert {name: found for name, found in importing.items() if found} == {}


# a module longer than this does several jobs (generated gRPC code aside)
MOST_LINES = 600


def test_no_product_module_is_over_its_length():
    lengths = {name: len(path.read_text().splitlines()) for name, path in PRODUCT.items()}
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def test_the_remediator_s_core_loads_no_client():
    """The pure core runs on answers alone: importing it loads no Kubernetes or HTTP
    client, nor the exporter."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, numaguard.remediator.core.planner, numaguard.remediator.core.rounds; "
            "print(*sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    clients = ("kubernetes", "aiohttp", "grpc", "numaguard.exporter")
    assert [m for m in loaded if m.startswith(clients)] == []


def write_requests(source: str) -> list[str]:
    """Requests made with a write method (``.call("POST", ...)``, the client's one door),
    or with a method only known at run time, and write verbs defined on a class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.args[0] if node.args else None
            if node.func.attr != "call" or method is None:
                continue
            if not isinstance(method, ast.Constant):  # a method decided at run time
                found.append(f"call {ast.unparse(method)}")
            elif str(method.value).upper() in WRITE_METHODS:
                found.append(f"call {method.value}")
        elif isinstance(node, ast.ClassDef):
            verbs = {"post", "put", "patch", "delete"}
            found += [
                f"{node.name}.{f.name}"
                for f in node.body
                if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef) and f.name in verbs
            ]
    return found


@pytest.mark.parametrize(
    "module", sorted(m for m in PRODUCT if m.startswith("numaguard.remediator"))
)
def test_only_the_actuator_writes_to_the_api_server(module):
    found = write_requests(PRODUCT[module].read_text())
    if module == "numaguard.remediator.actuator":
        assert sorted(found) == [
            "Writer.delete",
            "Writer.patch",
            "Writer.post",
            "Writer.put",
            "call method",  # Writer._write's, past the dry run's refusal
        ]
    else:
        assert found == []


def test_a_write_outside_the_actuator_is_caught():
    assert write_requests("async def f(kube):\n    await kube.call('PUT', '/x', body={})") == [
        "call PUT"
    ]
    assert write_requests("class Kube:\n    async def post(self, path, body): ...") == ["Kube.post"]
    assert write_requests("async def f(kube, verb):\n    await kube.call(verb, '/x')") == [
        "call verb"
    ]
    assert broken("numaguard.remediator.leader", {"kubernetes.aio"}) == ["kubernetes.aio"]
    assert broken("numaguard.remediator.kube", {"kubernetes.aio"}) == []


def test_a_plain_checkout_imports_without_installation(tmp_path):
    """The folders are the import paths: the repository's files, copied as a clone has
    them, import from its root with nothing of numaguard installed (the venv's editable
    install is taken off the import system)."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in filter(lambda n: (ROOT / n).is_file(), tracked):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    probe = """
import importlib, pkgutil, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
import numaguard
for module in pkgutil.walk_packages(numaguard.__path__, "numaguard."):
    if not module.name.endswith((".__main__", "_pb2_grpc")):
        loaded = importlib.import_module(module.name)
        assert loaded.__file__.startswith(sys.argv[1]), loaded.__file__
        print(module.name)
"""
    run = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = set(run.stdout.split())
    assert {"numaguard.exporter.model", "numaguard.remediator.core.planner"} <= found
    assert "numaguard.simulator.cluster.simulated" in found
    assert len(found) >= len(PRODUCT)


def test_the_notes_the_code_cites_are_in_the_repository():
    """Every document the code names is a file here; none points outside (a "SPEC")."""
    cited, outside = set(), []
    for path in [*(ROOT / "numaguard").rglob("*.py"), *(ROOT / "bench").glob("*.py")]:
        text = path.read_text()
        cited |= set(re.findall(r"\bdocs/[\w/.-]+\.md\b", text))
        outside += [f"{path.name}: {m}" for m in re.findall(r"\bSPEC\b[^\n]*", text)]
    assert "docs/design.md" in cited
    assert [c for c in sorted(cited) if not (ROOT / c).is_file()] == []
    assert outside == []
