"""One exercise: a piece of numformer's backward math for a student to write, and the file they start from.

An exercise names the *reference*: the function or method of numformer that computes a
backward pass (``numformer.layers.layernorm.layernorm_backward``, ``Residual.backward``). It
never copies it: the file a student gets (:func:`skeleton`) is generated from the reference's
signature with the body replaced by ``raise NotImplementedError``, at one of two levels:

* ``derive`` (the default): the forward's equations, the shapes and what the backward returns
  (the exercise's ``forward`` and ``returns``), and the forward code (shown, done); no backward
  equation. The student derives the gradient, which is the skill the exercise exists for;
  ``python -m grad_checks hint FILE`` reveals the derivation a step at a time (``steps``).
* ``implement``: the equations of the reference's module docstring (backward included) and the
  reference's docstring: the student turns given equations into array code.
Each catalogued mistake is a small function beside the exercise with the reference's signature,
its docstring's first line the explanation a student reads.

A *candidate* (the reference, the student's function, a mistake) runs inside numformer's own
layer class (:meth:`Exercise.layer_class`): a function through :func:`numformer.swap.using`, a
method as the override in a subclass. So every candidate is graded in the layer that trains, on
the exercise's cases (float64, padding, masks, repeated ids, replayed dropout masks).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from numformer.finite_differences import LayerContractError, detached_copy
from numformer.swap import using

from .trip_wires import permit


class OutputMismatch(Exception):
    """A candidate function returned the wrong structure, a wrong shape, or NaN: one line, plus what it
    returned (``raw``) so that a mistake failing the same way can still be recognised."""

    def __init__(self, message: str, raw=None, signature=None):
        super().__init__(message)
        self.raw = raw
        self.signature = signature or ("output", message)


def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if hasattr(value, "shape"):
        return f"an array of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


@dataclass
class Exercise:
    """A backward pass to write: the reference, the layer it runs in, its cases and its catalogue of mistakes.

    target: numformer's function (``layernorm_backward``) or method (``Residual.backward``).
    layer: numformer's class that runs ``target`` (and that ``train.py --swap`` replaces).
    cases: ``cases(layer_class, seed) -> [GradCase]``, deterministic in ``seed``: every candidate's
        layer is built alike, with the same weights, inputs and upstream gradients.
    outputs: names of a function target's return values, in order (``("dx", "dgamma", "dbeta")``).
    mistakes: functions with ``target``'s signature; the first line of each docstring explains it.
    show: code the file shows as done (the forward functions); a function target's layer methods are
        shown as well, so the student sees how their function is called.
    notes: what the equations do not say (shapes, in place, the children to call).
    doc: the skeleton's docstring when the target has none.
    imports: lines the file imports (helpers the student may use).
    swap: the layer name for ``--swap``; None when numformer has no such layer class.
    forward: the derive-level header: the forward's equations, the shapes the function receives and what it
        returns, in the paper's notation; no backward equation (a test searches for the reference's).
    returns: the derive-level docstring of the function to write: one line, what it returns.
    steps: the derivation, one step per ``hint``, in order; the last one gives the whole backward.
    names: the math names of the reference's intermediates, by their code or the variable they are bound to
        (``{"softmax_backward(dp, p)": "dS"}``), for the first wrong step (grad_checks/first_wrong_step.py);
        an intermediate not named there is called by its variable, else its code.
    symbols: the sizes a factor may be named by, each a function of the reference's arguments by name
        (``{"d": lambda a: a["dy"].shape[-1]}``); the scalar arguments (``scale``) are symbols already.
    entry_sets: ``(arguments, shape) -> {words: boolean mask broadcastable to shape}``: the entries of an
        intermediate of that shape the exercise has words for (the masked positions, the padding rows).
    stage: its place in the order to learn them, one of :data:`grad_checks.exercises.STAGES` (``"composition"``);
        ``rank`` orders the exercises of one stage (then their names; an activation's by its table's order).
    equivalent: the single-edit mutants of the reference (grad_checks/mutants.py) that compute the same thing on
        every input the layer gives it, by their edit, each with the reason (``python -m grad_checks mutants``
        lets these, and only these, survive).
    mode: what the target computes and is graded on: ``"backward"`` (a gradient, the default), ``"jvp"`` (a layer's
        forward mode: the outputs' tangents along each tensor) or ``"rop"`` (the tangent of a backward: every
        gradient's tangent); forward mode's cases carry ``jvp`` and ``backward_jvp``
        (numformer.finite_differences.tangent_checks grades them against its differences).
    upstream: the arguments the backward is linear in, the upstream gradient (``("dy",)``; the loss's
        ``("weight",)``, which holds its 1/N): what a value of the student's depends on to be a gradient, not a
        quantity of the forward side (grad_checks/first_wrong_step.py). Default: the first argument.
    """

    name: str
    title: str
    target: Callable
    layer: type
    cases: Callable
    mistakes: tuple
    outputs: tuple = ()
    show: tuple = ()
    notes: str = ""
    doc: str = ""
    imports: tuple = ()
    swap: str | None = None
    paper: str = ""
    in_place: tuple = ()  # arguments the function may change in place (the embedding's grad)
    upstream: tuple = ()  # the arguments carrying the upstream gradient (default: the first one, dy)
    forward: str = ""
    returns: str = ""
    steps: tuple = ()
    names: dict = field(default_factory=dict)
    symbols: dict = field(default_factory=dict)
    entry_sets: Callable | None = None
    stage: str = ""
    rank: int = 0
    equivalent: dict = field(default_factory=dict)
    mode: str = "backward"
    mistake_names: dict = field(init=False)

    def __post_init__(self):
        self.mistake_names = {m.__name__: m for m in self.mistakes}

    @property
    def is_method(self) -> bool:
        return "." in self.target.__qualname__

    @property
    def student_name(self) -> str:
        """What the student writes: ``layernorm_backward`` or ``Residual.backward``."""
        return f"{self.layer.__name__}.{self.target.__name__}" if self.is_method else self.target.__name__

    @property
    def reference_name(self) -> str:
        return f"{self.target.__module__}.{self.target.__qualname__}"

    @staticmethod
    def explanation(mistake) -> str:
        return (inspect.getdoc(mistake) or mistake.__name__).splitlines()[0]

    # -- candidates ---------------------------------------------------------------------------
    def layer_class(self, fn, guard: bool = True) -> type:
        """numformer's layer class running ``fn`` in place of the reference.

        With ``guard`` a function's outputs are checked against the reference's (called on a copy of
        the same arguments) for structure, shapes and NaN before the layer uses them, so a wrong
        shape is one clear line instead of a broadcasting error further on.
        """
        if self.is_method:
            return type(self.layer.__name__, (self.layer,), {self.target.__name__: fn})
        return using(self.layer, **{self.target.__name__: self._guarded(fn) if guard else fn})

    def _guarded(self, fn):
        reference, outputs, who, may_change = self.target, self.outputs, self.target.__name__, self.in_place
        names = list(inspect.signature(reference).parameters)

        def guarded(*args, **kwargs):
            before = detached_copy(args)
            got = fn(*args, **kwargs)
            # after the student's function has returned (nothing of numformer's answer exists while it runs), and
            # from this code, which the trip wires let through (grad_checks/trip_wires.py)
            expected = reference(*detached_copy(before), **kwargs)
            for name, old, new in zip(names, before, args):
                if isinstance(new, np.ndarray) and name not in may_change and not np.array_equal(old, new,
                                                                                                 equal_nan=True):
                    raise OutputMismatch(f"{who} changed its argument {name} in place: the layer hands the same "
                                         "array on (to the skip path, to other layers): compute into a new array",
                                         signature=("in place", name))
            check_outputs(got, expected, outputs, who)
            return got
        guarded.__name__ = who
        permit(guarded.__code__)
        return guarded


def check_outputs(got, expected, names, who) -> None:
    """Raise OutputMismatch (one line) unless ``got`` has ``expected``'s structure, shapes and finite values."""
    single = not isinstance(expected, tuple)
    exp = (expected,) if single else expected
    if single and isinstance(got, (tuple, list)):
        raise OutputMismatch(f"{who} returned {_describe(got)}; it returns one array, {names[0]}", raw=None)
    have = (got,) if single else got
    if not isinstance(have, (tuple, list)) or len(have) != len(exp):
        raise OutputMismatch(f"{who} returned {_describe(got)}; it returns {len(exp)}: ({', '.join(names)})")
    raw = tuple(None if g is None else np.asarray(g) for g in have)
    for name, g, e in zip(names, have, exp):
        if e is None:
            continue
        if g is None or not hasattr(g, "shape"):
            raise OutputMismatch(f"{who} returned {_describe(g)} as {name}; expected an array of shape "
                                 f"{tuple(e.shape)}", raw=raw, signature=("none", name))
        if tuple(g.shape) != tuple(e.shape):
            hint = ""
            if tuple(g.shape) == tuple(e.shape)[::-1]:
                hint = " (transposed?)"
            elif g.ndim != e.ndim:
                hint = " (summed over the wrong axis, or not summed?)"
            elif g.ndim == 1:
                hint = " (summed over the wrong axis?)"
            else:
                hint = " (the wrong operands, or the wrong axis?)"
            raise OutputMismatch(f"{name} (returned by {who}) has shape {tuple(g.shape)}, expected "
                                 f"{tuple(e.shape)}{hint}", raw=raw, signature=("shape", name, tuple(g.shape)))
        bad = ~np.isfinite(np.asarray(g))
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise OutputMismatch(f"{name} (returned by {who}) holds NaN or inf at {first} ({int(bad.sum())} of "
                                 f"{bad.size} entries)", raw=raw, signature=("nan", name))


def named_gradients(result, who: str, names) -> dict:
    """A backward that returns several gradients (encoder-decoder: the queries' input and the memory):
    ``{name: gradient}``, or one clear line when it returned something else."""
    if not isinstance(result, tuple) or len(result) != len(names):
        raise LayerContractError(f"{who} returned {_describe(result)}; here it returns {len(names)} gradients "
                                 f"({', '.join(names)})")
    missing = [n for n, g in zip(names, result) if g is None]
    if missing:
        raise LayerContractError(f"{who} returned None as the gradient of {missing[0]}; it has one")
    return dict(zip(names, result))


# -- the file a student starts from -------------------------------------------------------------------

def _source(obj) -> str:
    return textwrap.dedent(inspect.getsource(obj))


def _without_docstring(code: str) -> str:
    """A function's source with its docstring left out: a layer's ``backward`` may state the math in it."""
    node = ast.parse(code).body[0]
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        return code
    lines = code.splitlines()
    return "\n".join(lines[: first.lineno - 1] + lines[first.end_lineno:])


def _commented(code: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in code.rstrip().splitlines())


def _skeleton_of(target, doc: str, indent: str, message: str, own_doc: bool = True) -> str:
    """``target``'s def line(s) and docstring (``doc`` when it has none, or when not ``own_doc``), its body a
    NotImplementedError."""
    source = textwrap.dedent(inspect.getsource(target))
    node = ast.parse(source).body[0]
    lines = source.splitlines()
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str)
    inner = " " * body[0].col_offset
    if has_doc and own_doc:
        head = lines[: body[0].end_lineno]
    else:
        start = body[0].lineno - 1
        head = lines[:start] + [f'{inner}"""{line}' if i == 0 else (inner + line if line else "")
                                for i, line in enumerate(textwrap.wrap(doc, 100 - len(indent) - len(inner) - 3)
                                                         or [""])]
        head[-1] += '"""'
    head.append(f"{inner}raise NotImplementedError({message!r})")
    return textwrap.indent("\n".join(head), indent)


LEVELS = ("derive", "implement")


def _header(ex: Exercise, number: int, total: int, path: str, level: str) -> str:
    module = inspect.getmodule(ex.target)
    where = module.__name__.replace(".", "/") + ".py"
    parts = [f"Exercise {number} of {total}: {ex.title}" + (f" ({ex.paper})" if ex.paper else "")
             + f". Level: {level}."]
    if level == "derive":
        parts.append(_paragraphs(ex.forward))
        parts.append(textwrap.fill(f"Your part: derive the backward pass on paper from the forward above, then write "
                                   f"the body of {ex.student_name} below, replacing its `raise NotImplementedError`. "
                                   "The arrays are float64 when graded and float32 in training; every line must work "
                                   "on both.", 100))
        parts.append(f"Stuck? One step of the derivation at a time ({len(ex.steps)} steps):\n\n"
                     f"    python -m grad_checks hint {path}")
    else:
        equations = textwrap.indent(inspect.getdoc(module).strip(), "    ")
        parts += [f"From numformer ({where}):\n\n{equations}",
                  textwrap.fill(f"Your part: write the body of {ex.student_name} below, replacing its `raise "
                                "NotImplementedError`. The arrays are float64 when graded and float32 in training; "
                                "every line must work on both.", 100)]
        if ex.notes:
            parts.append(textwrap.fill(" ".join(ex.notes.split()), 100))
    check = f"    python -m grad_checks check {path}"
    parts.append("Check it (finite differences and numformer's own backward on several inputs; when it is wrong,\n"
                 "the report says where, and names the mistake or the term when it can):\n\n" + check)
    if ex.swap:
        cls = ex.layer.__name__
        parts.append("When it checks exact, train with it (every " + ex.swap + " numformer builds is yours):\n\n"
                     f"    python3 train.py --task copy --preset tiny --max-steps 300 --swap {ex.swap}={path}:{cls}\n"
                     f"    python3 train.py --corpus bible-en-es --preset small --max-steps 300 "
                     f"--swap {ex.swap}={path}:{cls}")
    text = "\n\n".join(parts)
    quote = 'r"""' if "\\" in text else '"""'
    return f"{quote}{text}\n\"\"\""


def _paragraphs(text: str) -> str:
    """``text`` with its paragraphs (blank-line separated) filled to 100 columns; indented lines (equations)
    kept as written."""
    out = []
    for para in textwrap.dedent(text).strip().split("\n\n"):
        if all(line.startswith(" ") for line in para.splitlines()):
            out.append(para)
        else:
            out.append(textwrap.fill(" ".join(para.split()), 100))
    return "\n\n".join(out)


def skeleton(ex: Exercise, number: int, total: int, path: str, level: str = "derive") -> str:
    """The text of the exercise file at ``level`` (:data:`LEVELS`), generated from numformer's code as it is now."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}: choose from {', '.join(LEVELS)}")
    cls = ex.layer.__name__
    ref_module = ex.layer.__module__
    message = f"{ex.student_name} is not written yet: replace this line with its body"
    own_doc = level == "implement"  # the reference's docstring states the backward: implement level only
    doc = ex.doc if own_doc else (ex.returns or ex.doc)
    out = [_header(ex, number, total, path, level), "", "import numpy as np", ""]
    out += list(ex.imports)
    out.append(f"from {ref_module} import {cls} as Numformer{cls}")
    if not ex.is_method:
        out.append("from numformer.swap import using")
    out += ["", f'EXERCISE = "{ex.name}"  # what `python -m grad_checks check` grades this file as', ""]
    shown = list(ex.show)
    if not ex.is_method:  # the layer's methods the exercise's function is called from (forward mode's, for its own)
        calling = ("forward", "backward") if ex.mode == "backward" else ("forward", "jvp", "backward_jvp")
        shown += [m for m in (getattr(ex.layer, name, None) for name in calling)
                  if m is not None and inspect.getmodule(m) is inspect.getmodule(ex.layer)]
    if shown:
        out.append("# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) "
                   "----")
        for obj in shown:
            code = _source(obj)
            if level == "derive" and obj.__name__ in ("backward", "jvp", "backward_jvp"):  # the call shown, not its math
                code = _without_docstring(code)
            out += ["#", f"# {obj.__module__}.{obj.__qualname__}:", _commented(code)]
        if not ex.is_method and any("kernel(" in _source(o) for o in shown):
            out += ["#", "# kernel(f) is numformer's switch to a fast version of f; for your function it is your function."]
        out.append("")
    out.append("")
    if ex.is_method:
        out += [f"class {cls}(Numformer{cls}):",
                f'    """numformer\'s {cls} (its __init__, forward and children), with your {ex.target.__name__}."""',
                "",
                _skeleton_of(ex.target, doc, "    ", message, own_doc), ""]
    else:
        out += [_skeleton_of(ex.target, doc, "", message, own_doc), "", "",
                f"# numformer's {cls}, its methods calling your {ex.target.__name__} (leave this line as it is):",
                f"# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.",
                f"{cls} = using(Numformer{cls}, {ex.target.__name__}={ex.target.__name__})", ""]
    return "\n".join(out)
