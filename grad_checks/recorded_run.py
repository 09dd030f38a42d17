"""A backward's code rewritten to record every array it computes, with the line that computed it.

To say where a student's backward first goes wrong (grad_checks/first_wrong_step.py), the grading runs
numformer's reference and the student's code on the same cases and compares what each computes *along
the way*, not only what each returns. :func:`recorded` rewrites a function (or a method) so that every
value of an array-valued sub-expression (``dy * gamma``, ``dxhat.mean(axis=-1, keepdims=True)``, a call's
result, ``.T``), every name it binds, every array it changes in place (``dz[rows, y] -= 1``,
``np.add.at(grad, ids, ...)``) and what it returns becomes a :class:`Record`: a float64 copy of the value,
the source text, the file's line, the records it was computed from (its operands: the sub-expressions
directly inside it and the names it reads) and the name it was bound to. Nothing per exercise: any
function whose source can be read is recorded, the student's and numformer's alike.

The rewritten code is compiled with the original file name and line numbers, so an exception in it
still points at the student's line; it runs in a copy of the function's globals (nothing is added to the
student's module) and with its closure's values (``super()`` keeps working). Code that cannot be
rewritten (no source: a builtin, a lambda typed at a prompt) is left as it is: :func:`recorded` returns
None and the grading says nothing about intermediates.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field

import numpy as np

from .counterparts import swapped_shape

_FLOAT64 = np.dtype(np.float64)
RECORDER = "__nf_recorder__"   # the names the rewritten code uses: unlikely in a student's file
CALL = "__nf_call__"


@dataclass
class Record:
    """One array a candidate computed: its value (float64 copy), the code and line, its operands' indices."""

    index: int
    node: int | None        # the expression's id in the rewritten function (None: an argument)
    code: str               # the source text (an argument: its name)
    line: int | None        # the line of the file
    value: np.ndarray
    operands: tuple = ()
    variable: str | None = None   # the name it was bound to, if any
    returned: int | None = None   # its position among the returned values, if returned
    given: bool = False           # an argument of the call, not computed
    kind: str = ""                # what computed it (see _kind)
    occurrence: int = 0           # how many records of the same expression came before it in the call
    dtype: np.dtype = _FLOAT64    # the dtype the code computed it in (the copy is float64)
    statement: int | None = None  # the line of the statement it is part of
    inside: str | None = None     # the helper of numformer's it was computed in (``softmax_backward``), if any

    @property
    def key(self) -> tuple:
        """The same intermediate in every call: the argument's name, or (expression, occurrence)."""
        return ("arg", self.code) if self.given else (self.node, self.occurrence)


@dataclass(eq=False)
class Call:
    """One call of the recorded function: its arguments (by name) and the records, in the order computed."""

    number: int
    args: dict
    records: list = field(default_factory=list)
    by_name: dict = field(default_factory=dict)     # name -> index of the record last bound to it
    by_node: dict = field(default_factory=dict)     # node id -> index of its latest record
    seen: dict = field(default_factory=dict)        # node id -> records of it so far
    returned: bool = False                          # it reached a return (did not raise)
    indices: dict = field(default_factory=dict)     # name -> (line, value) of an integer or boolean array bound
    index_code: dict = field(default_factory=dict)  # name -> the code whose value ``indices`` holds
    case: int = 0                                   # the exercise's case it ran in (from 0)


def _array(value):
    """A float64 copy of a floating array (numpy or anything with __array__; a float scalar as a 0-d array: a factor
    computed on its own line), else None (ids, masks, shapes, counts)."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, float):
        arr = np.array(value)
    elif hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "shape"):
        try:
            arr = np.asarray(value)
        except Exception:  # noqa: BLE001  (a device array, or anything that will not convert)
            return None
    else:
        return None
    if arr.dtype.kind != "f" or arr.size == 0:
        return None
    return np.array(arr, dtype=np.float64)


def _dtype(value):
    return getattr(value, "dtype", _FLOAT64)


def _as_value(override, value):
    """``override`` in the place of ``value``: its dtype, its shape when it has as many entries (another shape: a
    value of numformer's that the student's reduced, put back unreduced), a float for a float."""
    if isinstance(value, float) and not isinstance(value, np.floating):
        return float(np.asarray(override))
    out = np.asarray(override, dtype=getattr(value, "dtype", None))
    shape = np.shape(value)
    if out.shape == shape or out.size != int(np.prod(shape)):
        return out
    if out.ndim == len(shape) and all(a == b or a == 1 or b == 1 for a, b in zip(out.shape, shape)):
        return out  # a row statistic kept over the other axis: put back with its own axes, which broadcast
    if out.ndim == len(shape) >= 2 and out.shape == swapped_shape(shape):
        return out  # numformer's layout where the student's is transposed: as numformer's (a dW returned (d_out, d_in))
    return out.reshape(shape)


@dataclass
class _Node:
    code: str
    line: int
    children: tuple     # node ids directly inside it
    names: tuple        # names it reads that no child reads for it
    kind: str = ""      # what computes it (see _kind); "in place" for a statement changing an array
    statement: int = 0  # the line of the statement it is part of


class Recorder:
    """Collects the :class:`Call` of every run of the functions rewritten with it, in order."""

    def __init__(self, overrides: dict | None = None):
        self.calls: list = []
        self.nodes: dict = {}
        self.case = 0   # the case running now (set by the caller, see grad_checks/candidates.py's run_class)
        # {(call number, (node, occurrence)): array}: what an expression evaluates to instead, in that call
        # (numformer's reference replayed with a student's value at one step, to find the next mistake)
        self.overrides = overrides or {}

    # -- called by the rewritten code --------------------------------------------------------------
    def enter(self, args: dict) -> Call:
        call = Call(len(self.calls), dict(args), case=self.case)
        for name, value in args.items():
            override = self.overrides.get((call.number, ("arg", name)))
            if override is not None and isinstance(value, np.ndarray):  # an argument replayed with another value
                value = call.args[name] = _as_value(override, value)
            arr = _array(value)
            if arr is not None:
                call.by_name[name] = self._add(call, Record(len(call.records), None, name, None, arr,
                                                            variable=name, given=True, dtype=_dtype(value)))
        self.calls.append(call)
        return call

    def value(self, call: Call, node: int, value, bind=None, returned=None):
        """The value of expression ``node``, recorded (when an array) and handed back unchanged."""
        if returned is not None:
            call.returned = True
        if returned == "tuple" and not isinstance(value, tuple):
            returned = 0
        if isinstance(value, tuple) and (isinstance(bind, tuple) or returned == "tuple"):
            names = bind if isinstance(bind, tuple) else (None,) * len(value)
            return tuple(self._record(call, node, item, name, i if returned == "tuple" else None)
                         for i, (item, name) in enumerate(zip(value, names)))
        return self._record(call, node, value, bind if isinstance(bind, str) else None, returned)

    def inner(self, call: Call, node: int, value, helper: str):
        """The value of expression ``node`` of a helper of numformer's (``softmax_backward``) run inside the call:
        recorded with no operands, no name, never returned (see :func:`recorded`'s ``helpers``)."""
        arr = _array(value)
        if arr is not None and call is not None:
            info = self.nodes[node]
            occurrence = call.seen[node] = call.seen.get(node, -1) + 1
            self._add(call, Record(len(call.records), node, info.code, info.line, arr, kind=info.kind,
                                   occurrence=occurrence, dtype=_dtype(value), statement=info.statement, inside=helper))
        return value

    def changed(self, call: Call, node: int, name: str, value) -> None:
        """``name``'s array after a statement that may have changed it in place."""
        arr = _array(value)
        last = call.by_name.get(name)
        if arr is None or (last is not None and np.array_equal(call.records[last].value, arr)):
            return
        info = self.nodes[node]
        operands = tuple(i for i in (last,) if i is not None) + self._operands(call, info)
        occurrence, override = self._next(call, node)
        if override is not None and isinstance(value, np.ndarray):
            value[...] = np.asarray(override).reshape(value.shape)  # changed in place: so is its replacement
            arr = _array(value)
        call.by_name[name] = self._add(call, Record(len(call.records), node, info.code, info.line, arr, operands,
                                                    variable=name, kind=info.kind, occurrence=occurrence,
                                                    dtype=_dtype(value), statement=info.statement))

    # -- bookkeeping --------------------------------------------------------------------------------
    def _operands(self, call: Call, info: _Node) -> tuple:
        found = [call.by_node[c] for c in info.children if c in call.by_node]
        found += [call.by_name[n] for n in info.names if n in call.by_name]
        return tuple(dict.fromkeys(found))

    def _next(self, call: Call, node: int) -> tuple:
        """(this record's occurrence of ``node`` in the call, the value to replay in its place or None)."""
        occurrence = call.seen[node] = call.seen.get(node, -1) + 1
        return occurrence, self.overrides.get((call.number, (node, occurrence)))

    def _record(self, call, node, value, bind, returned):
        arr = _array(value)
        info = self.nodes[node]
        if arr is None:
            if bind and isinstance(value, np.ndarray) and value.dtype.kind in "biu":  # positions, a mask: kept aside
                override = self.overrides.get((call.number, ("position", bind)))
                value = value if override is None else np.asarray(override, dtype=value.dtype)
                call.indices[bind] = (info.statement, value.copy())
                call.index_code[bind] = info.code
            elif bind and isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
                # a count bound to a name (d = xhat.shape[-1]): kept aside as a 0-d position, replayable as an int
                override = self.overrides.get((call.number, ("position", bind)))
                value = value if override is None else int(np.asarray(override))
                call.indices[bind] = (info.statement, np.array(value))
                call.index_code[bind] = info.code
            return value
        occurrence, override = self._next(call, node)
        if callable(override):  # a value of this replay's own (another returned value, grad_checks/
            override = override(call, value)  # first_wrong_step.py's _swap)
        if override is not None:
            replaced = _as_value(override, value)
            if returned is not None and isinstance(value, np.ndarray) and value.flags.writeable \
                    and np.shape(replaced) == value.shape:
                value[...] = replaced  # a returned array may be a buffer filled in place (a parameter's .grad)
            else:
                value = replaced
            arr = _array(value)
        index = self._add(call, Record(len(call.records), node, info.code, info.line, arr,
                                       self._operands(call, info), variable=bind, returned=returned,
                                       kind=info.kind, occurrence=occurrence, dtype=_dtype(value),
                                       statement=info.statement))
        call.by_node[node] = index
        if bind:
            call.by_name[bind] = index
        return value

    @staticmethod
    def _add(call: Call, record: Record) -> int:
        call.records.append(record)
        return record.index


# -- the rewriting ------------------------------------------------------------------------------------

_RECORDED = (ast.BinOp, ast.UnaryOp, ast.Call, ast.Subscript, ast.Attribute, ast.IfExp)


class _Rewriter(ast.NodeTransformer):
    """Wraps each array-capable expression in ``__nf_recorder__.value(__nf_call__, id, expr)``."""

    def __init__(self, recorder: Recorder, source: str, first_line: int, helper: str | None = None):
        self.recorder, self.source, self.offset = recorder, source, first_line - 1
        self.helper = helper  # a helper's name: its values recorded inside the caller's call (Recorder.inner)

    # expressions ------------------------------------------------------------------------------------
    def _wrap(self, node, original, bind=None, returned=None):
        node_id = len(self.recorder.nodes)
        children, names = _direct(original)
        self.recorder.nodes[node_id] = _Node(ast.get_source_segment(self.source, original) or ast.unparse(original),
                                             original.lineno + self.offset, children, names, _kind(original),
                                             getattr(original, "_nf_statement", original.lineno) + self.offset)
        original._nf_id = node_id
        if self.helper is not None:
            return ast.Call(ast.Attribute(ast.Name(RECORDER, ast.Load()), "inner", ast.Load()),
                            [ast.Name(CALL, ast.Load()), ast.Constant(node_id), node, ast.Constant(self.helper)], [])
        keywords = []
        if bind is not None:
            keywords.append(ast.keyword("bind", ast.Constant(bind)))
        if returned is not None:
            keywords.append(ast.keyword("returned", ast.Constant(returned)))
        return ast.Call(ast.Attribute(ast.Name(RECORDER, ast.Load()), "value", ast.Load()),
                        [ast.Name(CALL, ast.Load()), ast.Constant(node_id), node], keywords)

    def _expr(self, node, bind=None, returned=None, always=False):
        """``node`` with its sub-expressions wrapped; itself too when recordable (or ``always``)."""
        inner = self.visit(node)
        if isinstance(node, ast.Starred):
            return inner  # (dx, *extra): the starred part is spread, not a value
        if always or isinstance(node, _RECORDED):
            return self._wrap(inner, node, bind, returned)
        return inner

    def generic_visit(self, node):
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ListComp,
                             ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return node  # their own scopes: left as written
        return super().generic_visit(node)

    def visit_Call(self, node):
        # a name passed to a child layer's method or a helper (``self.norm.backward(dy)``, ``dropout_backward(dp)``)
        # is recorded at that use too: the value a call is given, which can be wrong where the name is not
        # (a layer's backward called on another name too: ``sublayer.backward(dy)``, ``residual.backward(g, sub)``)
        use = isinstance(node.func, ast.Name) or (isinstance(node.func, ast.Attribute) and (
            _on_self(node.func) or node.func.attr in ("backward", "backward_jvp")))
        node.func = self._visit_func(node.func)
        node.args = [self._expr(a, always=use and isinstance(a, ast.Name)) for a in node.args]
        for k in node.keywords:
            k.value = self._expr(k.value, always=use and isinstance(k.value, ast.Name))
        return node

    def _visit_func(self, func):
        # the callee itself (``x.sum``, ``self.norm.backward``) is not a value to record; what it hangs off is
        if isinstance(func, ast.Attribute):
            func.value = self._expr(func.value)
            return func
        return self.visit(func)

    def visit_BinOp(self, node):
        node.left, node.right = self._expr(node.left), self._expr(node.right)
        return node

    def visit_UnaryOp(self, node):
        node.operand = self._expr(node.operand)
        return node

    def visit_Subscript(self, node):
        node.value = self._expr(node.value)
        node.slice = self._expr(node.slice)
        return node

    def visit_Attribute(self, node):
        node.value = self._expr(node.value)
        return node

    def visit_IfExp(self, node):
        node.test, node.body, node.orelse = self._expr(node.test), self._expr(node.body), self._expr(node.orelse)
        return node

    # statements -------------------------------------------------------------------------------------
    def visit_Assign(self, node):
        target = node.targets[0] if len(node.targets) == 1 else None
        if isinstance(target, ast.Name):
            node.value = self._expr(node.value, bind=target.id, always=True)
            return node
        if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            node.value = self._expr(node.value, bind=tuple(e.id for e in target.elts), always=True)
            return node
        node.value = self._expr(node.value)
        node.targets = [self._target(t) for t in node.targets]
        return [node] + self._changed(node, [_base_name(t) for t in node.targets])

    def visit_AugAssign(self, node):
        node.value = self._expr(node.value)
        node.target = self._target(node.target)
        return [node] + self._changed(node, [_base_name(node.target)])

    def visit_Expr(self, node):
        node.value = self._expr(node.value)
        call = node.value if isinstance(node.value, ast.Call) else None
        names = [a.id for a in map(_unwrapped, getattr(_unwrapped(call), "args", [])) if isinstance(a, ast.Name)] \
            if call else []
        return [node] + self._changed(node, names)

    def visit_Return(self, node):
        if node.value is None:
            return node
        if isinstance(node.value, ast.Tuple):
            node.value.elts = [self._expr(e, returned=i, always=True) for i, e in enumerate(node.value.elts)]
        else:
            node.value = self._expr(node.value, returned="tuple", always=True)  # a tuple at run time, maybe
        return node

    def _target(self, target):
        if isinstance(target, ast.Subscript):
            target.slice = self._expr(target.slice)
        return target

    def _changed(self, stmt, names) -> list:
        if self.helper is not None:
            return []  # a helper's arrays changed in place are its caller's (recorded there)
        out = []
        for name in dict.fromkeys(n for n in names if n):
            node_id = len(self.recorder.nodes)
            children, reads = _direct(stmt)
            self.recorder.nodes[node_id] = _Node(ast.get_source_segment(self.source, stmt) or ast.unparse(stmt),
                                                 stmt.lineno + self.offset, children, reads, "in place",
                                                 stmt.lineno + self.offset)
            call = ast.Call(ast.Attribute(ast.Name(RECORDER, ast.Load()), "changed", ast.Load()),
                            [ast.Name(CALL, ast.Load()), ast.Constant(node_id), ast.Constant(name),
                             ast.Name(name, ast.Load())], [])
            out.append(ast.copy_location(ast.Expr(call), stmt))
        return out


_ARRAY_MODULES = ("np", "numpy", "xp", "cp", "cupy")


def _kind(node) -> str:
    """What computes ``node``, to tell a counterpart from an unrelated array: the operator ("Mult", "Sub",
    "MatMult"), the array function or method ("where", "sum", "T"), "[]", "name" (a name bound again); "call NAME"
    for any other function (numformer's helpers, a layer's backward), which may compute anything."""
    if isinstance(node, ast.BinOp):
        return type(node.op).__name__
    if isinstance(node, ast.UnaryOp):
        return type(node.op).__name__
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            base = _unwrapped(func.value)
            while isinstance(base, ast.Attribute):
                base = _unwrapped(base.value)
            if isinstance(base, ast.Name) and base.id in _ARRAY_MODULES:
                return func.attr                      # np.where, xp.asarray
            if isinstance(base, ast.Name) and base.id == "self":
                return f"call {_dotted(func)}"        # a child layer's method: self.w_o.backward
            return func.attr                          # an array's method: x.sum, ds.swapaxes
        return f"call {func.id}" if isinstance(func, ast.Name) else "call"
    if isinstance(node, ast.Subscript):
        return "[]"
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return "name"
    return type(node).__name__


def _dotted(node) -> str:
    """``self.w_o.backward`` of an attribute chain, under the recorder's wrapping."""
    node = _unwrapped(node)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _unwrapped(call):
    """A Call as written, under the recorder's wrapping."""
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "value" \
            and isinstance(call.func.value, ast.Name) and call.func.value.id == RECORDER:
        return call.args[2]
    return call


def _on_self(func) -> bool:
    """``self.norm.backward``, ``self._split``: an attribute chain starting at ``self``."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id == "self"


def _base_name(target):
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def _direct(node) -> tuple:
    """(ids of the recorded expressions directly inside ``node``, names read outside them), from the tree as
    written (the ids were set on the original nodes as they were wrapped, innermost first)."""
    children, names = [], []

    def walk(n, top):
        if not top and getattr(n, "_nf_id", None) is not None:
            children.append(n._nf_id)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in (RECORDER, CALL):
            names.append(n.id)
        for child in ast.iter_child_nodes(n):
            walk(child, False)
    walk(node, True)
    return tuple(dict.fromkeys(children)), tuple(dict.fromkeys(names))


def _parsed(fn, source=None):
    """(the function unwrapped, its source dedented, its first line, its file, its ``def``) or None when its source
    cannot be read or parsed. ``source``: its text edited (grad_checks/own_route.py), its lines where they were."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))  # a layer's method comes wrapped by its taps (module.py)
    try:
        source = textwrap.dedent(source if source is not None else inspect.getsource(fn))
        first = fn.__code__.co_firstlineno
        filename = fn.__code__.co_filename
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, AttributeError, ValueError):
        return None
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        return None
    fdef.decorator_list = []
    return fn, source, first, filename, fdef


def _made(fn, fdef, first: int, filename: str, namespace: dict):
    """``fdef`` compiled as ``fn`` was (its file and lines, its closure's values, its defaults, its names), or None."""
    freevars = fn.__code__.co_freevars
    maker = ast.FunctionDef("__nf_make__", ast.arguments([], [ast.arg(v) for v in freevars], None, [], [], None, []),
                            [fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], [], None)
    module = ast.Module([maker], [])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, first - 1)
    try:
        exec(compile(module, filename, "exec"), namespace)  # noqa: S102  (the candidate's own code, rewritten)
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
        new = namespace["__nf_make__"](*cells)
    except Exception:  # noqa: BLE001  (code the rewriting cannot handle: graded without intermediates)
        return None
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__qualname__, new.__module__ = fn.__qualname__, fn.__module__
    return new


def recorded(fn, recorder: Recorder, source: str | None = None, helpers: bool = False):
    """``fn`` rewritten to record into ``recorder`` (see the module's docstring), or None when its source
    cannot be read or rewritten; ``source``: its text edited, to run in its place (see :func:`_parsed`).
    ``helpers``: the functions of numformer's layers it calls by name (``softmax_backward(dp, p)`` in attention's
    backward) record their arrays too, inside its call (numformer's reference: its row sums are values known)."""
    parsed = _parsed(fn, source)
    if parsed is None:
        return None
    fn, source, first, filename, fdef = parsed
    namespace = dict(fn.__globals__)
    for node in ast.walk(fdef) if helpers else ():
        name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        helper = fn.__globals__.get(name)
        if inspect.isfunction(helper) and helper.__module__.startswith("numformer.layers."):
            inside = _helper(helper, recorder)
            if inside is not None:
                namespace[name] = inside
    params = [a.arg for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs if a.arg != "self"]
    for stmt in ast.walk(fdef):  # each expression's statement (an inner statement's after its outer one's)
        if isinstance(stmt, ast.stmt) and stmt is not fdef:
            for node in ast.walk(stmt):
                node._nf_statement = stmt.lineno
    rewriter = _Rewriter(recorder, source, first)
    fdef.body = [rewriter.visit(stmt) for stmt in fdef.body]
    # a statement may come back as a list (it and its ``changed`` calls); NodeTransformer flattens the nested
    # bodies (if, for, with) itself, the function's own body is flattened here
    fdef.body = [s for stmt in fdef.body for s in (stmt if isinstance(stmt, list) else [stmt])]
    enter = ast.parse(f"{CALL} = {RECORDER}.enter({{{', '.join(f'{p!r}: {p}' for p in params)}}})").body[0]
    # the arguments as enter() hands them back: an override replaces one (see Recorder.overrides)
    rebind = [ast.parse(f"{p} = {CALL}.args.get({p!r}, {p})").body[0] for p in params]
    fdef.body = [enter] + rebind + fdef.body
    namespace[RECORDER] = recorder
    return _made(fn, fdef, first, filename, namespace)


def _helper(fn, recorder: Recorder):
    """A helper of numformer's rewritten to record its arrays into the caller's current call (its last), or None."""
    parsed = _parsed(fn)
    if parsed is None:
        return None
    fn, source, first, filename, fdef = parsed
    rewriter = _Rewriter(recorder, source, first, helper=fn.__name__)
    fdef.body = [rewriter.visit(stmt) for stmt in fdef.body]
    fdef.body = [s for stmt in fdef.body for s in (stmt if isinstance(stmt, list) else [stmt])]
    fdef.body = [ast.parse(f"{CALL} = {RECORDER}.calls[-1] if {RECORDER}.calls else None").body[0]] + fdef.body
    namespace = dict(fn.__globals__)
    namespace[RECORDER] = recorder
    return _made(fn, fdef, first, filename, namespace)


def rewritten(fn, source: str):
    """``fn`` compiled from ``source`` (its own text, edited, each line where it was), unrecorded, in its globals
    and with its closure's values; None when that text does not compile."""
    parsed = _parsed(fn, source)
    if parsed is None:
        return None
    fn, _, first, filename, fdef = parsed
    return _made(fn, fdef, first, filename, dict(fn.__globals__))
