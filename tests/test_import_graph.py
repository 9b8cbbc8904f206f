"""The import graph of pipeline/ and jobs/ has no circle, the release kinds sit below the stream, and
the stream's packages keep their boundaries (process plumbing and the protocols without Kafka clients,
the releaser wired only by jobs/, the wire below the roles).

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
anywhere in a module counts, inside functions and ``if TYPE_CHECKING:`` blocks too, since an
import moved into a function to dodge a circle still makes one. An edge goes to the module a name
is imported from — ``from pipeline.releases import kind_of`` is an edge to the package
``pipeline.releases``, ``from pipeline.releases import base`` to the submodule ``pipeline.releases.base``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "jobs")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement may load (the longest that is a module of ours is kept)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        return [f"{origin}.{alias.name}" for alias in node.names]
    return []


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: first line importing it}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph, component) -> str:
    members = set(component)
    return "\n".join(f"  {m} -> " + ", ".join(f"{t} (line {line})" for t, line in sorted(graph[m].items())
                                               if t in members) for m in component)


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "pipeline.stream.releaser.engine" in graph and "jobs.worker" in graph
    assert "pipeline.releases" in graph["pipeline.config"]  # kinds() (an attribute of the package)
    assert "pipeline.releases.base" in graph["pipeline.releases.fixed_window"]  # a relative import


def test_the_circle_finder_finds_a_function_local_circle():
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 9}, "d": {"a": 2}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_circle_in_pipeline_and_jobs():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (function-local imports count):\n" + "\n\n".join(
        _describe(graph, c) for c in found)


def test_release_kinds_import_nothing_of_the_stream():
    """The stream drives the kinds (aggregators in the workers, release_step in the releaser); a kind
    that reached up into pipeline.stream would tie the plug-ins to one runtime."""
    graph = import_graph()
    upward = [f"{m} -> {t} (line {line})" for m, edges in graph.items() if m.startswith("pipeline.releases")
              for t, line in edges.items() if t.startswith("pipeline.stream")]
    assert not upward, "\n".join(upward)


def test_the_configuration_does_not_import_the_plan():
    """The budget check belongs to the deployment model (Deployment.budget_plan)."""
    graph = import_graph()
    assert "pipeline.plan" not in graph["pipeline.config"]


def test_the_command_line_is_split_by_audience_over_a_common_base():
    """pipeline.cli's audience modules share pipeline.cli.common, which imports none of them (nor the
    package: its __init__ holds the parser and imports every audience)."""
    graph = import_graph()
    audiences = {f"pipeline.cli.{name}" for name in ("lifecycle", "operator", "analyst")}
    assert audiences | {"pipeline.cli.common"} <= set(graph)
    assert all("pipeline.cli.common" in graph[m] for m in audiences)
    assert not {t for t in graph["pipeline.cli.common"] if t.startswith("pipeline.cli")}
    assert not {t for m in audiences for t in graph[m] if t in audiences or t == "pipeline.cli"}


KAFKA_CLIENTS = frozenset({"kafka", "aiokafka"})


def external_imports(module: str) -> dict[str, int]:
    """Top-level names of the libraries ``module`` imports (anywhere in it) -> first line."""
    path = _modules()[module]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in PACKAGES:
                found.setdefault(top, node.lineno)
    return found


def _in(package: str, graph) -> list[str]:
    members = [m for m in graph if m == package or m.startswith(package + ".")]
    assert members, f"no package {package}"
    return members


def test_process_plumbing_uses_no_kafka_client():
    """pipeline.stream.process (settings, supervision, metrics, limits, fault hooks) is what every
    stream process has around its work; the Kafka clients live in pipeline.stream.kafka, of which it
    reads only the topic declarations."""
    graph = import_graph()
    found = [f"{m} imports {lib} (line {line})" for m in _in("pipeline.stream.process", graph)
             for lib, line in external_imports(m).items() if lib in KAFKA_CLIENTS]
    found += [f"{m} -> {t} (line {line})" for m in _in("pipeline.stream.process", graph)
              for t, line in graph[m].items()
              if t.startswith("pipeline.stream.kafka") and t != "pipeline.stream.kafka.topics"]
    assert not found, "\n".join(found)


def test_the_coordinators_and_the_commit_order_use_no_kafka_client():
    """The ingest and release protocols run without Kafka (tests drive them over an in-memory log);
    the job hands them a producer."""
    graph = import_graph()
    modules = ["pipeline.stream.ingest.coordinator", "pipeline.stream.releaser.coordinator",
               "pipeline.stream.state.commit_order"]
    assert set(modules) <= set(graph)
    found = [f"{m} imports {lib} (line {line})" for m in modules
             for lib, line in external_imports(m).items() if lib in KAFKA_CLIENTS]
    assert not found, "\n".join(found)


def test_the_releaser_package_is_imported_only_by_jobs():
    """pipeline.stream.releaser (the releaser's logic) is wired by jobs.releaser and driven by the
    benchmarks and evaluations in jobs/; nothing else in pipeline/ reaches into it."""
    graph = import_graph()
    members = set(_in("pipeline.stream.releaser", graph))
    found = [f"{m} -> {t} (line {line})" for m, edges in graph.items()
             if m.startswith("pipeline") and m not in members
             for t, line in edges.items() if t in members]
    assert not found, "\n".join(found)


def test_the_wire_imports_no_role_of_the_stream():
    """pipeline.stream.kafka (topics, message formats, clients) sits below the roles that use it:
    it imports nothing of ingest/, releaser/ or state/."""
    graph = import_graph()
    roles = ("pipeline.stream.ingest", "pipeline.stream.releaser", "pipeline.stream.state")
    found = [f"{m} -> {t} (line {line})" for m in _in("pipeline.stream.kafka", graph)
             for t, line in graph[m].items() if t.startswith(roles)]
    assert not found, "\n".join(found)
