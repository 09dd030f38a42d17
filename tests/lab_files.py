"""Exercise files as a student would leave them: the generated skeleton with a function written in.

``filled(ex, fn, path)`` is the text of ``python -m grad_checks exercise NAME``'s file with the stub of
the function (or method) to write replaced by ``fn``'s source, renamed to the reference's name and with
imports for the module-level names it uses: the reference itself (a student who got it right), a
catalogued mistake (one who made that mistake), or any other function.
"""
import ast
import inspect
import sys
import textwrap

from grad_checks import exercises
from grad_checks.exercise import skeleton


def _global_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def filled(ex, fn, path) -> str:
    text = skeleton(ex, exercises.number(ex.name), len(exercises.ORDER), str(path))
    fdef = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    fdef.name = ex.target.__name__
    fdef.decorator_list = []  # a student's file holds the function alone (a held-out answer is marked where it is kept)
    body = ast.unparse(fdef)
    module = vars(sys.modules[fn.__module__])
    imports = sorted(f"from {fn.__module__} import {n}" for n in _global_names(fn.__code__)
                     if n in module and n not in ("np", fdef.name) and not n.startswith("__"))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {ex.target.__name__}("))
    if ex.is_method:
        end = len(lines)
        body = textwrap.indent(body, "    ")
    else:
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("# numformer's"))
    first_import = next(i for i, line in enumerate(lines) if line.startswith("import numpy"))
    out = lines[:first_import + 1] + imports + lines[first_import + 1:start] + [body, "", ""] + lines[end:]
    return "\n".join(out) + "\n"


def write(ex, fn, folder):
    path = folder / f"my_{ex.name}.py"
    path.write_text(filled(ex, fn, path), encoding="utf-8")
    return path
