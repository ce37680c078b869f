"""The house has no circles: facebench's modules import each other one way, each room (a folder,
or a loose module) imports only the rooms below it, and the config layer stands on nothing of
facebench's but its errors.

The graph is read from the code with `ast`: every import, at the top of a module or deferred
inside a function (a deferred import closes a circle as surely as any other), and the package
`__init__` that Python runs before any module of a package is imported from outside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from facebench.host.paths import PROJECT_ROOT

PACKAGE = "facebench"
# The config layer: what every other layer reads its settings from.
CONFIG_ROOM = "facebench.config"
# What the config layer may import: the errors every layer raises (a module with no imports).
CONFIG_MAY_IMPORT = {"facebench.errors"}
# The rooms, bottom first, in the order one run's data flows through them: a room imports only
# rooms of the layers below its own (rooms that share a layer import neither of each other).
LAYERS = [
    {"errors"},
    {"config"},
    # what reading from an object store cost, carried with each batch; what an epoch costs
    {"fetches", "costs"},
    {"stage_metrics"},  # the stage times' record and an epoch's sums, which stages tallies
    {"stages", "results"},  # what loaders record per image; a job's record on disk
    {"host"},
    {"storage"},  # data in a bucket: addresses, credentials, the client, a local server
    {"data"},
    {"shards"},
    {"custom"},  # a user's own pipeline: built, probed inside, checked
    {"loaders"},
    {"measure"},
    {"tracking"},
    {"run"},
    {"watching"},  # a user's own loop, measured where it runs: watch(loader)
    {"report"},
    {"advise"},
    {"generate", "profile", "upload"},  # commands: python -m facebench.<name>
]
MOST_LOOSE = 10  # loose modules beside the folders, __init__ aside


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under `package_dir`, by dotted name."""
    found = {}
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement asks for (module or module.attribute)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, up `level - 1` packages
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (each a module, not an attribute of one)."""
    known = modules(package_dir)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for wanted in _imported(node, name, is_package):
                target = resolve(wanted) if wanted.startswith(package_dir.name) else None
                if target is None or target == name:
                    continue
                graph[name].add(target)
                # Python runs a package's __init__ before a module of it is imported from
                # outside the package.
                parts = target.split(".")
                for depth in range(2, len(parts)):
                    parent = ".".join(parts[:depth])
                    if not (name + ".").startswith(parent + "."):
                        graph[name].add(parent)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def described(graph: dict[str, set[str]], group: list[str]) -> str:
    arrows = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
    return f"circle of {len(group)}: " + "; ".join(arrows)


def layer_of(module: str, layers: list[set[str]] = LAYERS) -> int:
    """The layer of a module's room (facebench.host.paths: host's); a room not in `layers` is an
    error that names it, so that a new folder is placed on purpose."""
    room = module.split(".")[1]
    for index, rooms in enumerate(layers):
        if room in rooms:
            return index
    raise AssertionError(f"{module}: room {room!r} is in no layer of tests/test_imports.py LAYERS")


def upward(graph: dict[str, set[str]], layers: list[set[str]] = LAYERS) -> list[str]:
    """Each import of a room at or above the importer's layer, other than its own room's."""
    found = []
    for module in sorted(name for name in graph if "." in name):
        layer_of(module, layers)  # every room placed, imports or not
        for target in sorted(graph[module]):
            if "." not in target or target.split(".")[1] == module.split(".")[1]:
                continue
            if layer_of(target, layers) >= layer_of(module, layers):
                found.append(f"{module} -> {target}: {target.split('.')[1]} is not below it")
    return found


def test_each_room_imports_only_the_rooms_below_it():
    found = upward(import_graph(PROJECT_ROOT / PACKAGE))
    assert not found, "\n".join(found)


def test_facebench_holds_a_few_loose_modules_beside_its_rooms():
    loose = sorted(
        path.stem for path in (PROJECT_ROOT / PACKAGE).glob("*.py") if path.stem != "__init__"
    )
    assert len(loose) <= MOST_LOOSE, f"{len(loose)} loose modules in facebench/: {loose}"
    rooms = [path for path in (PROJECT_ROOT / PACKAGE).iterdir() if (path / "__init__.py").exists()]
    for room in rooms:  # each says what it holds and may import
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc, f"{room}/__init__.py: say what it holds, may import"


def test_an_import_that_runs_up_is_found_and_named_even_deferred(tmp_path):
    package = tmp_path / PACKAGE
    for room in ("host", "loaders", "run"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("")
    (package / "host" / "paths.py").write_text("import facebench.config\n")  # down: fine
    (package / "run" / "epoch.py").write_text("from facebench.loaders.plan import plan\n")
    (package / "loaders" / "plan.py").write_text(
        "def plan():\n    from facebench.run.epoch import EPOCH  # deferred, and up\n"
    )
    layers = [{"config"}, {"host"}, {"loaders"}, {"run"}]
    graph = import_graph(package)
    assert upward(graph, layers) == [
        "facebench.loaders.plan -> facebench.run: run is not below it",
        "facebench.loaders.plan -> facebench.run.epoch: run is not below it",
    ]
    (package / "loaders" / "plan.py").write_text("def plan(): ...\n")
    assert upward(import_graph(package), layers) == []
    (package / "report.py").write_text("")
    try:
        upward(import_graph(package), layers)
    except AssertionError as error:
        assert "room 'report' is in no layer" in str(error)
    else:
        raise AssertionError("a room in no layer was let through")


def test_facebench_has_no_import_circles():
    graph = import_graph(PROJECT_ROOT / PACKAGE)
    found = [described(graph, group) for group in circles(graph)]
    assert not found, "\n".join(found)


def test_the_config_layer_imports_nothing_of_facebench_but_its_errors():
    graph = import_graph(PROJECT_ROOT / PACKAGE)
    config_layer = {name for name in graph if f"{name}.".startswith(f"{CONFIG_ROOM}.")}
    assert len(config_layer) > 1, "the config room holds its modules"
    for module in config_layer:
        above = graph[module] - config_layer - CONFIG_MAY_IMPORT
        assert not above, f"{module} imports {sorted(above)}: the config layer stands on nothing"
    assert graph["facebench.errors"] == set()


def test_a_circle_is_found_and_named_even_through_a_deferred_import(tmp_path):
    package = tmp_path / PACKAGE
    (package / "loaders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(
        "def check():\n    from facebench.loaders import names  # deferred\n    return names()\n"
    )
    (package / "loaders" / "__init__.py").write_text("from facebench.loaders.spec import Spec\n")
    (package / "loaders" / "spec.py").write_text("from ..config import check\nclass Spec: ...\n")
    (package / "report.py").write_text("import facebench.config\n")  # above it: no circle
    graph = import_graph(package)
    assert circles(graph) == [["facebench.config", "facebench.loaders", "facebench.loaders.spec"]]
    text = described(graph, circles(graph)[0])
    assert "facebench.config -> facebench.loaders" in text
    assert "facebench.loaders.spec -> facebench.config" in text
