"""The house rules of docs/ARCHITECTURE.md, checked on the source: rooms import downwards only,
no module imports itself back through others (package __init__ files included), vLLM only in
engine/, Streamlit only in console/, argparse only in cli/, no module imports its own package's
__init__ or a sibling room's private name, modules stay readable, one definition of the stall
rule, and the runtime reads engines and frame sources only through their declared contracts.
The rooms are folders: a rule names a folder, never a list of modules."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Higher rooms may import lower ones, never the reverse; rooms of one level not each other.
LEVEL = {"console": 4, "cli": 4, "services": 3, "gateway": 2, "metrics": 2, "runtime": 1,
         "control": 0, "engine": 0, "load_gen": 0, "store": 0}
MAX_LINES = 300  # "read in one sitting": the central rooms
MAX_LINES_ANY = 350  # every other product module (console/, cli/, services/, engine/, ...)
ROOMS_KEPT_SMALL = ("runtime", "control", "store", "gateway")
# Product code: everything but the tests, the benchmarks (which measure vLLM and Streamlit
# directly) and environments.
NOT_PRODUCT = ("tests", "benchmarks", ".venv", "build", "shared")
# The console's room, and the two scripts at the root Streamlit runs (the launcher and the
# per-session script, which must not sit beside a pages/ folder).
UI_ROOM = "console"
UI_SCRIPTS = {"streamlit_app", "console_app"}
CLI_ROOM = "cli"
# Commands of their own beside the CLI: developer scripts (screenshots, digests).
COMMAND_ROOMS = {CLI_ROOM, "scripts"}


def _room(mod: str) -> str:
    return mod.split(".")[0]


def _is_ui(mod: str) -> bool:
    return _room(mod) == UI_ROOM or mod in UI_SCRIPTS


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _product_files() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] not in NOT_PRODUCT)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in _product_files()}


def _imported_names(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module named in the statement, [what it resolves to]) for every absolute import, lazy
    ones included: `from a import b` resolves to a.b when b is a module, else to a."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [f"{node.module}.{a.name}" for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, [a.name]) for a in node.names)
    return out


def _imports(path: pathlib.Path, modules: dict) -> set[str]:
    """Project modules imported anywhere in the file (function-level imports included: a lazy
    import is still a dependency). `from pkg import name` depends on pkg.name when that is a
    module, and on pkg's __init__ otherwise."""
    found = set()
    for source, targets in _imported_names(ast.parse(path.read_text())):
        for target in targets:
            if target in modules:
                found.add(target)
            elif source in modules:
                found.add(source)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {mod: _imports(path, modules) - {mod} for mod, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    return cycles


def test_rooms_import_downwards_only():
    wrong = []
    for mod, deps in _graph().items():
        room = mod.split(".")[0]
        if room not in LEVEL:
            continue
        for dep in deps:
            dep_room = dep.split(".")[0]
            if dep_room != room and LEVEL[dep_room] >= LEVEL[room]:
                wrong.append(f"{mod} → {dep}")
    assert not wrong, wrong


def test_no_import_cycles_package_inits_included():
    # A package's __init__ importing its submodules counts: a submodule that imports back
    # into its package's __init__ (directly or through others) is a cycle.
    cycles = _cycles(_graph())
    assert not cycles, [" → ".join(c) for c in cycles]


def test_the_cycle_check_sees_an_init_cycle():
    # The check itself: pkg/__init__ → pkg.a → pkg (its __init__) is a cycle.
    assert _cycles({"pkg": {"pkg.a"}, "pkg.a": {"pkg"}}) == [["pkg", "pkg.a", "pkg"]]


def test_no_module_imports_its_own_package_init():
    # Inside a package, import a sibling module (`from runtime.config import RunConfig`,
    # `from services import charts`), never a name of the package's __init__ (`from runtime import
    # RunConfig`, `import runtime`): that __init__ may be half-imported, importing this module.
    modules = _modules()
    wrong = []
    for mod, path in modules.items():
        parts = mod.split(".")
        is_pkg = path.name == "__init__.py"
        own = {".".join(parts[:i]) for i in range(1, len(parts) + is_pkg)}
        for source, targets in _imported_names(ast.parse(path.read_text())):
            if source in own and (source in targets or any(t not in modules for t in targets)):
                wrong.append(f"{mod} imports {source}")
    assert not wrong, wrong


def test_central_rooms_stay_readable():
    long = {str(p.relative_to(ROOT)): n for room in ROOMS_KEPT_SMALL
            for p in (ROOT / room).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_every_product_module_stays_readable():
    long = {str(p.relative_to(ROOT)): n for p in _product_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES_ANY}
    assert not long, long


def _importing(package: str) -> dict[str, pathlib.Path]:
    return {mod: path for mod, path in _modules().items()
            if any(src == package or src.startswith(package + ".")
                   for src, _ in _imported_names(ast.parse(path.read_text())))}


def test_only_engine_imports_vllm():
    found = sorted(mod for mod in _importing("vllm") if mod.split(".")[0] != "engine")
    assert not found, found


def test_only_the_ui_room_imports_streamlit():
    found = sorted(mod for mod in _importing("streamlit") if not _is_ui(mod))
    assert not found, found


def test_only_the_cli_room_parses_flags():
    found = sorted(mod for mod in _importing("argparse") if _room(mod) not in COMMAND_ROOMS)
    assert not found, found


def test_no_module_imports_a_sibling_rooms_private_name():
    # `from store.writer import _batch` from runtime/ reaches into another room's privates;
    # a room's private names are for its own modules.
    modules = _modules()
    wrong = []
    for mod, path in modules.items():
        for source, targets in _imported_names(ast.parse(path.read_text())):
            if source.split(".")[0] == _room(mod) or source.split(".")[0] not in LEVEL:
                continue
            wrong += [f"{mod} imports {t}" for t in targets
                      if t.rsplit(".", 1)[-1].startswith("_") and t not in modules]
            wrong += [f"{mod} imports {source}" for part in source.split(".")
                      if part.startswith("_") and not part.startswith("__")]
    assert not wrong, wrong


def test_outside_the_ui_room_nothing_loads_streamlit_through_it():
    # The CLI, the services and the gateway run without Streamlit: none of them imports a UI
    # module (which would import Streamlit for them).
    wrong = [f"{mod} → {dep}" for mod, deps in _graph().items() if not _is_ui(mod)
             for dep in deps if _is_ui(dep)]
    assert not wrong, wrong


def test_the_stall_rule_is_defined_once():
    found = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in _product_files()
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, (ast.Assign, ast.AnnAssign))
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(target, ast.Name) and target.id == "STALL_TICKS"]
    assert len(found) == 1, found


def test_runtime_reads_engines_and_sources_through_their_contracts():
    # Engine (engine/contract.py) and FrameSource (load_gen/frames.py) declare all the runtime
    # reads; a name looked up at run time is a contract nobody wrote down.
    pattern = re.compile(r"\b(getattr|hasattr)\(")
    found = [f"{p.name}:{i}" for p in (ROOT / "runtime").rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
