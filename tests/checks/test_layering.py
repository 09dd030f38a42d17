"""The layering of docs/layout.md, read from the imports of every numformer module (with ``ast``, nothing is
imported): numformer never imports ``grad_checks`` (the tools sit above the library), the module import graph
has no circle, and the math imports no machinery beyond the ``kernel()`` switch.

Every import counts, those inside functions too (a lazy import is still a dependency): ``import a.b``,
``from a import b`` (an edge to the module ``a.b`` when it is one, else to ``a``, a package meaning its
``__init__``), relative imports, and ``importlib.import_module("a.b")`` with a literal name.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "numformer"

# The math files and what they may import from numformer (docs/layout.md, "THE MATH"): the ground floor (the
# activations' and the norms' tables among it), the other layers, and the machinery only through its one switch,
# ``numformer.kernels`` itself.
MATH_FILES = sorted(PACKAGE.glob("layers/*.py")) + [PACKAGE / "loss.py", PACKAGE / "optim.py"]
MATH_MAY_IMPORT = ("numformer.backend", "numformer.module", "numformer.parameter_buffer", "numformer.errors",
                   "numformer.activations", "numformer.norms",
                   "numformer.kernels", "numformer.layers", "numformer.layers.*")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def numformer_modules() -> dict:
    """Module name -> path, for every module of the package (a package is its ``__init__``)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _main_guard(node) -> bool:
    """``if __name__ == "__main__":``"""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def imports_of(name: str, path: Path, known, main_guard: bool = True) -> list:
    """(imported module, line) for every import in the module ``name``, at any depth of its code.

    ``main_guard=False`` leaves out what a module imports under ``if __name__ == "__main__":`` (run as
    ``python -m``, the module is ``__main__``, a module of its own: importing the module it is a copy
    of from there is no circle).

    Names outside numformer are kept as written (``numpy``, ``grad_checks.grading``); a numformer name is
    resolved to the module it loads: ``a.b`` when that is a module, else the longest known prefix.
    Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b`` first; that implicit edge from a
    submodule to its parent packages is not counted: every package whose ``__init__`` imports its own
    submodules (``numformer.layers``) would otherwise be a circle, and Python allows exactly this order
    (the parent's ``__init__`` runs first and imports the submodule, which finds the parent in sys.modules).
    An explicit ``from numformer.layers import Linear`` inside a submodule of ``numformer.layers`` is
    counted, and is a circle.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(target: str) -> str:
        if not target.startswith("numformer"):
            return target
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        return target

    found = []
    guarded = set()
    if not main_guard:
        guarded = {id(n) for top in tree.body if _main_guard(top) for n in ast.walk(top)}
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            found += [(resolve(alias.name), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else resolve(base), node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((resolve(node.args[0].value), node.lineno))
    return found


def import_graph(modules: dict) -> dict:
    """Module -> {imported numformer module: the first line importing it}."""
    graph = {}
    for name, path in modules.items():
        edges = {}
        for target, line in imports_of(name, path, modules, main_guard=False):
            if target in modules and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """A shortest circle (a list of modules, the first repeated at the end) in each strongly connected
    component of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]

    def strongconnect(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [min((_circle_through(graph, component, start) for start in sorted(component)), key=len)
            for component in components]


def _circle_through(graph: dict, component: set, start: str) -> list:
    """A shortest circle from ``start`` back to it within the component (breadth-first search)."""
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if child in component and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle found in {sorted(component)}")  # pragma: no cover


def _where(graph: dict, modules: dict, circle: list) -> str:
    return " -> ".join(f"{a} ({modules[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(circle, circle[1:])) \
        + f" -> {circle[-1]}"


def _allowed_for_math(target: str) -> bool:
    return any(target == rule or (rule.endswith(".*") and target.startswith(rule[:-1])) for rule in MATH_MAY_IMPORT)


def test_the_reader_sees_every_kind_of_import(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import numpy as np\n"
                    "from . import linear, Linear\n"
                    "from ..kernels import kernel\n"
                    "from .registry import layer_class\n"
                    "def f():\n"
                    "    import numformer.model\n"
                    "    from grad_checks.grading import grade\n"
                    "    return importlib.import_module('numformer.loss')\n")
    known = numformer_modules()
    got = imports_of("numformer.layers.mod", path, known)
    assert got == [("numpy", 1), ("numformer.layers.linear", 2), ("numformer.layers", 2), ("numformer.kernels", 3),
                   ("numformer.layers.registry", 4), ("numformer.model", 6), ("grad_checks.grading", 7),
                   ("numformer.loss", 8)]


def test_numformer_never_imports_grad_checks():
    modules = numformer_modules()
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {target}"
                 for name, path in modules.items() for target, line in imports_of(name, path, modules)
                 if target == "grad_checks" or target.startswith("grad_checks.")]
    assert not offenders, ("numformer sits below grad_checks (docs/layout.md): hand what it needs from the "
                           "exercises in as a parameter instead; " + "; ".join(offenders))


def test_the_module_import_graph_has_no_circle():
    modules = numformer_modules()
    graph = import_graph(modules)
    assert "numformer.layers.registry" in graph["numformer.model"]  # the graph sees the imports it should
    found = cycles(graph)
    assert not found, "import circles: " + " | ".join(_where(graph, modules, c) for c in found)


def test_the_math_imports_only_the_ground_the_layers_and_the_kernel_switch():
    modules = numformer_modules()
    offenders = []
    for path in MATH_FILES:
        name = module_name(path)
        for target, line in imports_of(name, path, modules):
            if target.startswith("numformer") and not _allowed_for_math(target):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, ("the math (numformer/layers/, loss.py, optim.py) imports only "
                           f"{', '.join(MATH_MAY_IMPORT)}: " + "; ".join(offenders))


def package_of(module: str) -> str:
    """The package a module belongs to: the first name under numformer (``numformer.layers``,
    ``numformer.model`` for a top-level module). A package's ``__main__`` (what ``python -m`` runs) is a node of
    its own, on top: nothing in the package imports it, so its imports cannot close a circle through the
    package (as the ``if __name__ == "__main__":`` block of a module, left out above)."""
    if module.endswith(".__main__"):
        return module
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict) -> dict:
    """Package -> {imported package: 'module (file:line)' of the first import}, over every import; every
    package is a key."""
    modules = numformer_modules()
    out = {package_of(name): {} for name in modules}
    for name, edges in graph.items():
        a = package_of(name)
        for target, line in edges.items():
            b = package_of(target)
            if b != a:
                out[a].setdefault(b, f"{name} ({modules[name].relative_to(ROOT)}:{line})")
    return out


def test_no_package_imports_one_that_imports_it_back():
    """The floors of docs/layout.md between packages: counting every import (inside functions and
    ``importlib`` ones too), no package reaches one that reaches it back (the kernels register against the
    math by name, numformer.kernels.twins, so the switch the math calls imports no math)."""
    graph = package_graph(import_graph(numformer_modules()))
    assert "numformer.kernels" in graph["numformer.layers"]  # the graph sees the switch
    found = cycles({a: set(edges) for a, edges in graph.items()})
    said = []
    for circle in found:
        said.append(" -> ".join(f"{a} [{graph[a][b]}]" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}")
    assert not found, "packages importing each other: " + " | ".join(said)


# Names that begin with an underscore and are public all the same (the standard library's documented ones).
PUBLIC_UNDERSCORE = {"os._exit", "sys._getframe"}
# A library's object, not numformer's, and why: pysword has no public way to keep a decompressed block, and
# reading the Bible without it takes minutes (numformer/data/bible/sword.py says so where it does it).
OTHER_LIBRARIES = {("numformer/data/bible/sword.py", "bible._decompressed_text")}


def private_reaches(path: Path) -> list:
    """'file:line what' for every read or write of another object's private attribute (``x._name`` where x
    is not ``self`` or ``cls``) and every import of a private name, in one file. numformer/module.py's Module
    walking its own kind (``child._named_parameters_all``, ``m._buffers``) is Python's class privacy, not a
    reach into a layer: the file is held to the rule only for other objects than Modules, which is not
    decidable from the text, so it is left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            text = ast.unparse(node)
            if text not in PUBLIC_UNDERSCORE and (str(where), text) not in OTHER_LIBRARIES:
                out.append(f"{where}:{node.lineno} {text}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("numformer", "")) and node.level:
            out += [f"{where}:{node.lineno} imports {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_reaches_into_another_objects_private_attributes():
    offenders = [reach for path in sorted(PACKAGE.rglob("*.py")) if path.name != "module.py"
                 and "__pycache__" not in path.parts for reach in private_reaches(path)]
    assert not offenders, ("read what a layer keeps through its public contract (Module.saved, Module.tap), "
                           "not its private attributes: " + "; ".join(offenders))


def method_replacements(path: Path) -> list:
    """'file:line' for every assignment of ``forward`` or ``backward`` onto an object (``m.forward = f``,
    ``setattr(m, "backward", f)``, ``object.__setattr__(m, "forward", f)``) in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in ("forward", "backward"):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(t)} = ...")
        if isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in ("forward", "backward") \
                and ast.unparse(node.func) in ("setattr", "object.__setattr__"):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return out


def test_no_method_is_replaced_on_a_live_object():
    offenders = [r for path in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in path.parts
                 for r in method_replacements(path)]
    assert not offenders, "observe or hold a layer with Module.tap, not by replacing its methods: " + "; ".join(offenders)


def test_the_readers_find_a_private_reach_and_a_replaced_method(tmp_path):
    path = ROOT / "tests" / "checks" / "_planted_reach.py"
    try:
        path.write_text("def f(m, g):\n    x = m._cache_x\n    m.forward = g\n    object.__setattr__(m, 'backward', g)\n"
                        "    self._ok = 1\n    os._exit(0)\n")
        assert private_reaches(path) == ["tests/checks/_planted_reach.py:2 m._cache_x"]
        assert [r.split(" ")[0] for r in method_replacements(path)] == ["tests/checks/_planted_reach.py:3",
                                                                        "tests/checks/_planted_reach.py:4"]
    finally:
        path.unlink()


def test_the_package_reader_finds_a_planted_circle():
    graph = {"numformer.layers.a": {"numformer.kernels.b": 3}, "numformer.kernels.b": {"numformer.layers.c": 7},
             "numformer.layers.c": {}}
    packages = {}
    for name, edges in graph.items():
        for target in edges:
            packages.setdefault(package_of(name), set()).add(package_of(target))
    packages.setdefault("numformer.layers", set())
    assert cycles(packages) == [["numformer.kernels", "numformer.layers", "numformer.kernels"]]
