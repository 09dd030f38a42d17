"""Train with your own backward: a user's layer class in place of numformer's, wherever numformer builds it.

numformer builds its layers through :mod:`numformer.layers.registry` (``layer_class("LayerNorm")(...)`` in
``model.py``, ``layers/sublayer.py``, ``layers/attention.py`` ...). :func:`swapped` puts the user's classes
there for the duration of a ``with`` block, so every layer numformer constructs inside it is the user's
class::

    from numformer.swap import load_class, swapped
    MyLayerNorm = load_class("my_layernorm.py", "LayerNorm")
    with swapped(LayerNorm=MyLayerNorm):
        model = Transformer(cfg)            # every LayerNorm in it is a MyLayerNorm
        trainer = Trainer(model, ...)       # the loss too, when LabelSmoothedCrossEntropy is swapped
        trainer.train()

``train.py --swap LayerNorm=my_layernorm.py:LayerNorm`` does the same (:func:`swapped_from_specs`).
The user's class should subclass numformer's and override ``backward`` (what the exercises of
``python -m grad_checks exercise`` write): its parameters then keep numformer's names and
shapes, so a checkpoint trained with it loads into numformer and back. :func:`check_layout`
verifies that against a model built without the swap. Grading the swapped layers before training
is the exercises' business: ``grad_checks.swap_grading.grade_swap`` is what ``train.py`` hands to
:func:`swapped_from_specs` (numformer itself imports nothing of ``grad_checks``).

:func:`using` builds such a class from functions: numformer's class, its methods calling the
given function (``layernorm_backward=my_function``) in place of numformer's. The methods are
numformer's own code re-bound to the new function, not copies, so they cannot go stale.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import types
from pathlib import Path

from . import user_code_clock
from .errors import UsageError, mark_collective
from .layers import registry
from .user_code import UserCodeError, exception_line, load_file, where
from .user_code_exits import UserCodeLeft, contained


class SwapError(UsageError):
    """A --swap that cannot work (unknown layer, missing file or class, no backward, another parameter
    layout) or a swapped layer that raised while training; the message is one line."""


def swappable() -> dict:
    """Layer name -> numformer's class, for every class a swap may replace (``registry.NAMES``)."""
    return registry.numformer_classes()


# -- using(): numformer's class calling other functions ---------------------------------------------

def _rebound(function, namespace):
    """A copy of ``function`` (same code, defaults, closure) that looks its globals up in ``namespace``."""
    new = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                             function.__closure__)
    new.__kwdefaults__ = function.__kwdefaults__
    new.__doc__, new.__qualname__, new.__module__ = function.__doc__, function.__qualname__, function.__module__
    return new


def using(layer_class: type, **functions) -> type:
    """A subclass of ``layer_class`` whose methods call ``functions`` (by the name their module uses)
    in place of numformer's: ``using(LayerNorm, layernorm_backward=mine)``.

    Every method of ``layer_class`` that names one of the functions is re-bound to a copy of its
    module's globals where that name is the given function; ``kernel(f)`` (the switch to a fast
    version) gives back the given functions unchanged, since no fast version of them exists.
    """
    module = sys.modules[layer_class.__module__]
    unknown = [name for name in functions if name not in vars(module)]
    if unknown:
        raise ValueError(f"{module.__name__} has no function {unknown[0]!r} for {layer_class.__name__} to call")
    namespace = dict(vars(module))
    namespace.update(functions)
    if "kernel" in namespace:
        real_kernel, given = namespace["kernel"], list(functions.values())
        namespace["kernel"] = lambda plain: plain if any(plain is f for f in given) else real_kernel(plain)
    methods, used = {}, set()
    for attr, value in vars(layer_class).items():
        raw = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if not isinstance(raw, types.FunctionType):
            continue
        names = set(raw.__code__.co_names) & set(functions)
        if names:
            used |= names
            new = _rebound(raw, namespace)
            methods[attr] = type(value)(new) if isinstance(value, (staticmethod, classmethod)) else new
    unused = sorted(set(functions) - used)
    if unused:
        raise ValueError(f"no method of {layer_class.__name__} calls {unused[0]}")
    first = next(iter(functions.values()))
    methods.update(__module__=getattr(first, "__module__", __name__), __qualname__=layer_class.__name__,
                   __doc__=f"numformer's {layer_class.__name__}, calling {', '.join(functions)} given to "
                           "numformer.swap.using", using=dict(functions))
    return type(layer_class.__name__, (layer_class,), methods)


# -- swapped(): the user's classes wherever numformer builds a layer ---------------------------------

@contextlib.contextmanager
def swapped(swaps: dict | None = None, **classes):
    """Inside the block numformer builds the given classes wherever it builds those layers.

    ``swaps`` / ``classes``: layer name (``"LayerNorm"``, see :func:`swappable`) -> class, put in
    :mod:`numformer.layers.registry` for the block. Layers built inside the block are the given
    classes and stay so after it; the registry is restored on exit.
    """
    given = dict(swaps or {}, **classes)
    known = swappable()
    unknown = [name for name in given if name not in known]
    if unknown:
        raise SwapError(f"unknown layer {unknown[0]!r} for --swap: choose from {', '.join(known)}")
    with registry.replaced(given):
        yield


@contextlib.contextmanager
def unswapped():
    """Inside a swapped() block: numformer's own classes again for a moment (to build a model to compare with)."""
    with registry.numformer_only():
        yield


# -- --swap LAYER=FILE.py:CLASS ----------------------------------------------------------------------

def _inputs_of(args) -> tuple:
    """What a forward's positional arguments are, for its backward's check: (shape, dtype) of each array, None for
    anything else (a sub-layer, an offset)."""
    return tuple((tuple(a.shape), a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype") else None for a in args)


def returned_gradients_misfit(inputs: tuple, result, names) -> str | None:
    """What is wrong with a backward's ``result`` against its forward's ``inputs`` (:func:`_inputs_of`), or None.

    The layer contract: backward returns dL/d(input) for the forward's array inputs, in their order (one array, or a
    tuple: attention's (dq, dk, dv), cross-attention's (dx, dmemory)), each of its input's shape and dtype; None
    where there is none (an embedding's ids). A gradient of another shape that numpy would broadcast ((B, T, 1)
    into (B, T, 128)) trains on without an error, on wrong numbers: so shapes are compared, not merely used.
    ``names``: the forward's argument names, for the message."""
    if result is None:
        return None
    grads = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    for i, grad in enumerate(grads):
        expected = inputs[i] if i < len(inputs) else None
        if expected is None or grad is None:
            continue
        name = names[i] if i < len(names) else f"argument {i + 1}"
        shape, dtype = expected
        if not (hasattr(grad, "shape") and hasattr(grad, "dtype")):
            return f"returned {type(grad).__name__} for the input {name} of shape {shape} {dtype}"
        if tuple(grad.shape) != shape or grad.dtype != dtype:
            return (f"returned a gradient of shape {tuple(grad.shape)} {grad.dtype} for the input {name} of shape "
                    f"{shape} {dtype}")
    return None


def _attributed(cls: type, name: str, path: Path) -> type:
    """``cls`` with the methods it defines itself wrapped so that an exception they raise while training (a call of
    ``sys.exit`` among them) becomes one line naming the user's file (a SwapError: exit 2, checkpoints kept), not a
    report of a bug in numformer, and with every gradient its backward returns checked against the shape and dtype
    of the input it is the gradient of (:func:`returned_gradients_misfit`), from the first call on: a wrong one is
    one line naming the class, the method and both shapes."""
    original = swappable()[name]
    names = list(inspect.signature(original.forward).parameters)[1:]
    inputs: dict = {}  # id(layer) -> what its last forward was given
    wrapped = {}
    for method in ("forward", "backward"):
        fn = getattr(cls, method, None)
        mine = fn is not None and fn is not getattr(original, method, None)
        if not mine and not (method == "forward" and cls.backward is not getattr(original, "backward", None)):
            continue

        def guarded(self, *args, _fn=fn, _method=method, _mine=mine, **kwargs):
            if _method == "forward":
                inputs[id(self)] = _inputs_of(args)
            try:
                result = _fn(self, *args, **kwargs)
            except SwapError:
                raise
            except SystemExit as exc:  # the user's code ending the process: not while a run is to be saved
                raise SwapError(f"your {cls.__name__}.{_method} from {path} called sys.exit({exc.code!r}) at "
                                f"{where(exc, path)}: a layer's methods return; remove that") from None
            except Exception as exc:  # noqa: BLE001  (the user's code)
                if not _mine:
                    raise
                raise SwapError(f"your {name}.{_method} from {path} raised "
                                f"{exception_line(exc, path)}") from exc
            if _method == "backward":
                wrong = returned_gradients_misfit(inputs.get(id(self), ()), result, names)
                if wrong is not None:
                    raise SwapError(f"your {cls.__name__}.backward from {path} (swapped in for {name}) {wrong}: a "
                                    f"backward returns the gradient of each input with that input's shape and dtype; "
                                    f"check it with python -m grad_checks check {path}")
            return result
        guarded.__name__ = method
        wrapped[method] = guarded
    if not wrapped:
        return cls
    wrapped.update(__module__=cls.__module__, __qualname__=cls.__qualname__, __doc__=cls.__doc__, user_class=cls)
    return type(cls.__name__, (cls,), wrapped)


def parse_spec(spec: str) -> tuple:
    """``LAYER=FILE.py[:CLASS]`` -> (layer, path, class name); the class name defaults to the layer's."""
    layer, sep, rest = spec.partition("=")
    if not sep or not layer or not rest:
        raise SwapError(f"--swap {spec!r}: write LAYER=FILE.py:CLASS, e.g. LayerNorm=my_layernorm.py:LayerNorm")
    path, _, cls_name = rest.rpartition(":") if rest.rpartition(":")[0].endswith(".py") else (rest, "", "")
    return layer.strip(), Path(path.strip()), (cls_name.strip() or layer.strip())


def load_class(path, class_name: str, layer: str | None = None) -> type:
    """The class ``class_name`` of the file ``path``, checked to have the layer contract of ``layer``."""
    layer = layer or class_name
    known = swappable()
    if layer not in known:
        raise SwapError(f"unknown layer {layer!r} for --swap: choose from {', '.join(known)}")
    try:  # the file's own top-level code runs here: under the clock, as the grading runs its layers, and kept from
        # leaving by another door (an exit, a fork, a thread left running: numformer/user_code_exits.py)
        with contained(path, "while importing"), user_code_clock.deadline(
                user_code_clock.DEFAULT_TIME_LIMIT, f"importing {Path(path).name}", path,
                advice=f"fix it, and check it with python -m grad_checks check {path}"):
            module = load_file(path)
    except (UserCodeError, user_code_clock.StudentCodeTimeout) as exc:
        raise SwapError(f"--swap {layer}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__]
        raise SwapError(f"--swap {layer}: {path} has no class {class_name!r}"
                        + (f" (it defines {', '.join(classes)})" if classes else ""))
    if not isinstance(cls, type):
        raise SwapError(f"--swap {layer}: {path}:{class_name} is not a class")
    for method in ("forward", "backward"):
        if not callable(getattr(cls, method, None)):
            raise SwapError(f"--swap {layer}: {path}:{class_name} has no {method} method: a layer needs forward "
                            f"and backward (subclass numformer's {layer} and override backward)")
    return _attributed(cls, layer, Path(path))


def describe(swaps: dict, files: dict, grade=None) -> list:
    """One line per swapped layer: where it comes from and, with a ``grade``, how its backward grades.

    ``grade(layer, user_class, file) -> line`` (``file``: ``"PATH:CLASS"``) is given by the caller:
    ``train.py`` passes ``grad_checks.swap_grading.grade_swap`` (the exercise's cases against numformer's
    backward). It raises SwapError for a layer that must not be trained with (not written yet); that error
    is raised alike by every process of a data-parallel run. Without ``grade`` nothing is graded.
    """
    lines = []
    for layer, cls in swaps.items():
        if grade is None:
            lines.append(f"swap: {layer} <- {files[layer]} (not graded)")
            continue
        try:
            with contained(files[layer].rpartition(":")[0], "while its backward was graded"):
                lines.append(grade(layer, getattr(cls, "user_class", cls), files[layer]))
        except UserCodeLeft as exc:  # an exit, a fork, a thread left running: named, never trained with
            raise mark_collective(SwapError(f"--swap {layer}: {exc}")) from None
        except SwapError as exc:  # every process of a data-parallel run stops here alike

            raise mark_collective(exc) from None
    return lines


@contextlib.contextmanager
def swapped_from_specs(specs, log=print, grade=None, expand=None):
    """``train.py --swap``: load every spec (a bad one fails here, in one line, before any data is read),
    log where each swapped layer comes from and, with ``grade``, how it grades (:func:`describe`), then
    run the block with them swapped in.

    ``expand(folder) -> (specs, lines)`` turns ``all=DIR`` into one spec per layer solved in DIR (the caller's:
    ``train.py`` passes ``grad_checks.swap_grading.solved_specs``); without it ``all=`` is refused."""
    if not specs:
        yield {}
        return
    specs = expanded(specs, expand, log)
    swaps = from_specs(specs)
    files = {}
    for spec in specs:
        layer, path, cls_name = parse_spec(spec)
        files[layer] = f"{path}:{cls_name}"
    for line in describe(swaps, files, grade):
        log(line)
    with swapped(swaps):
        yield swaps


def expanded(specs, expand, log=print) -> list:
    """``specs`` with every ``all=DIR`` replaced by ``expand(DIR)``'s specs (its lines logged)."""
    out = []
    try:
        for spec in specs:
            layer, sep, folder = spec.partition("=")
            if layer.strip() != "all" or not sep:
                out.append(spec)
                continue
            if expand is None:
                raise SwapError("--swap all=DIR needs the exercises' grading (train.py provides it)")
            more, lines = expand(folder.strip())
            for line in lines:
                log(line)
            out += more
    except SwapError as exc:  # every process of a data-parallel run fails here alike
        raise mark_collective(exc) from None
    return out


def from_specs(specs) -> dict:
    """``["LayerNorm=my_layernorm.py:LayerNorm", ...]`` -> {layer name: class}, every spec checked."""

    swaps = {}
    try:
        for spec in specs or []:
            layer, path, cls_name = parse_spec(spec)
            if layer in swaps:
                raise SwapError(f"--swap {layer} given twice: swap each layer once")
            swaps[layer] = load_class(path, cls_name, layer)
    except SwapError as exc:  # every process of a data-parallel run fails here alike
        raise mark_collective(exc) from None
    return swaps


def check_layout(model, build) -> None:
    """A swapped model must have numformer's parameter names and shapes, and its persistent buffers (a frozen
    logits bias), so that checkpoints stay portable.

    ``build()`` builds the same model again; it is called with numformer's own classes (inside a
    swapped() block too). Raises SwapError naming the first difference.
    """
    mine = [(n, tuple(a.shape)) for n, a in model.named_state()]
    with unswapped():
        ref = [(n, tuple(a.shape)) for n, a in build().named_state()]
    if mine == ref:
        return
    names, ref_names = dict(mine), dict(ref)
    missing = [n for n in ref_names if n not in names]
    extra = [n for n in names if n not in ref_names]
    shape = [n for n in ref_names if n in names and names[n] != ref_names[n]]
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"adds {extra[0]}"
    elif shape:
        what = f"gives {shape[0]} the shape {names[shape[0]]} instead of {ref_names[shape[0]]}"
    else:
        what = "orders its parameters differently"
    raise SwapError(f"with the swapped layers the model {what}: its checkpoints would not load into numformer; "
                    "subclass numformer's layer and keep its __init__ (override backward only)")
