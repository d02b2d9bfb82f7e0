"""The house rules of docs/ARCHITECTURE.md, checked on the source: rooms import downwards only,
no module imports itself back through others, the central rooms stay readable, and the runtime
reads the engine only through the declared contract."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Higher rooms may import lower ones, never the reverse; rooms of one level not each other.
LEVEL = {"app": 3, "gateway": 2, "runtime": 1, "control": 0, "engine": 0, "load_gen": 0,
         "store": 0}
MAX_LINES = 300  # "read in one sitting"
ROOMS_KEPT_SMALL = ("runtime", "control", "store", "gateway")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for room in LEVEL:
        for path in (ROOT / room).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(path: pathlib.Path, modules: dict) -> set[str]:
    """Project modules imported anywhere in the file (function-level imports included: a lazy
    import is still a dependency)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name in modules:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {mod: _imports(path, modules) - {mod} for mod, path in modules.items()}


def test_rooms_import_downwards_only():
    wrong = []
    for mod, deps in _graph().items():
        room = mod.split(".")[0]
        for dep in deps:
            dep_room = dep.split(".")[0]
            if dep_room != room and LEVEL[dep_room] >= LEVEL[room]:
                wrong.append(f"{mod} → {dep}")
    assert not wrong, wrong


def test_no_import_cycles():
    graph = _graph()
    # A package's __init__ importing its own submodules is how packages re-export; a cycle
    # needs a submodule importing back into one that imports it.
    for mod in graph:
        graph[mod] = {d for d in graph[mod] if not d.startswith(mod + ".")}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    assert not cycles, [" → ".join(c) for c in cycles]


def test_central_rooms_stay_readable():
    long = {str(p.relative_to(ROOT)): n for room in ROOMS_KEPT_SMALL
            for p in (ROOT / room).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_gateway_never_imports_streamlit():
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "gateway").rglob("*.py")
             if re.search(r"^\s*(import|from) streamlit", p.read_text(), re.M)]
    assert not found, found


def test_runtime_reads_the_engine_through_its_contract():
    pattern = re.compile(r"(getattr|hasattr)\((self\.)?engine\b")
    found = [f"{p.name}:{i}" for p in (ROOT / "runtime").rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
