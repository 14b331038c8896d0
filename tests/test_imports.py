"""The import graph, read from the source with ast (imports inside functions included): which
package may import which, and no cycle among planner's modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FACADE = {"planner.api", "planner.report", "planner.export", "planner.errors"}
"""What the dashboard may import of planner: the API, and the rendering of its answers."""
DASHBOARD = [ROOT / "app.py", *sorted((ROOT / "dashboard").glob("*.py"))]
"""The dashboard: the page (app.py) and its parts (dashboard/)."""


def imports(path: Path) -> set[str]:
    """The modules `path` imports, anywhere in it, as dotted names (`from planner import x` -> planner.x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def planner_graph() -> dict[str, set[str]]:
    """{module: planner modules it imports}, subpackages included (planner.engines.deepspeed ...)."""
    modules = {module_name(p): p for p in (ROOT / "planner").rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_planner_has_no_import_cycle():
    graph, state, cycles = planner_graph(), {}, []

    def visit(node, trail):  # depth-first; a node met again on the trail closes a cycle
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_nothing_in_planner_imports_the_api_or_the_cli():
    # api and cli are the top: every other planner module sits below them
    above = {"planner.api", "planner.cli", "planner.__main__"}
    assert "planner.engines.deepspeed" in planner_graph()  # the rooms are read
    assert {n: sorted(g & above) for n, g in planner_graph().items() if n not in above and g & above} == {}


def test_planner_never_imports_calibrate_or_the_heavy_packages():
    heavy = ("calibrate", "torch", "deepspeed", "streamlit", "scipy.optimize", "accelerate", "transformers")
    found = {module_name(p): sorted(m for m in imports(p) if m.split(".")[0] in heavy or m.startswith("scipy.optimize"))
             for p in (ROOT / "planner").rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_dashboard_uses_the_api_only():
    assert ROOT / "dashboard" / "charts.py" in DASHBOARD  # the parts are read
    used = {str(p.relative_to(ROOT)): sorted({".".join(m.split(".")[:2]) for m in imports(p)
                                              if m.startswith("planner.")} - FACADE) for p in DASHBOARD}
    assert {k: v for k, v in used.items() if v} == {}


def test_nothing_outside_planner_imports_its_private_names():
    # calibrate/, the dashboard and the benchmarks use what planner's modules make public
    private = {str(p.relative_to(ROOT)): sorted(m for m in imports(p) if m.startswith("planner.")
                                                 and m.rsplit(".", 1)[-1].startswith("_"))
               for p in [*DASHBOARD, *(ROOT / "calibrate").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]}
    assert {k: v for k, v in private.items() if v} == {}


def test_no_engine_name_comparison_outside_the_engines_rooms():
    # formulas read the engine records' fields (planner/engines/); a published run's *source* may be
    # named like an engine (corpus_score.py's torchtitan GiB figures), which is no engine comparison
    from planner.engines import ARCHIVED, NAMES

    names = set(NAMES) | set(ARCHIVED)
    found = []
    for path in (ROOT / "planner").rglob("*.py"):
        if "engines" in path.relative_to(ROOT / "planner").parts:
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            literal = [s for s in sides for c in ([s] if not isinstance(s, (ast.Tuple, ast.Set, ast.List)) else s.elts)
                       if isinstance(c, ast.Constant) and c.value in names]
            if literal and "source" not in ast.get_source_segment(text, node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_the_module_map_names_every_module():
    """docs/development.md's module map (which the README points to) names every module of planner/
    and dashboard/ in backquotes, and each engine's room: a module added without a line fails here."""
    doc = (ROOT / "docs" / "development.md").read_text()
    modules = [p.stem for d in ("planner", "dashboard") for p in (ROOT / d).glob("*.py")
               if p.stem not in ("__init__", "__main__")]
    rooms = [p.name for p in (ROOT / "planner" / "engines").iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in modules + rooms if f"`{m}" not in doc]
    assert not missing, f"docs/development.md's module map lacks {missing}"
