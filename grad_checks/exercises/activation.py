"""Exercise: the backward of a gated activation of numformer's table (numformer.activations), made from its row.

Every activation without an exercise file of its own (``relu`` and ``silu`` have one) gets this exercise: its
layer's ``<name>_backward(dy, x, gate)``, graded in its layer on the cases below, with the mistakes every
activation of the form ``y = x * g(x)`` invites. The forward's equations come from the layer file's docstring
first paragraph and its forward code, shown as done.
"""
from __future__ import annotations

import inspect
from importlib import import_module

import numpy as np

from numformer.activations import ACTIVATIONS
from numformer.finite_differences import GradCase
from numformer.layers.registry import numformer_classes

from ..exercise import Exercise


def gate_only(dy, x, gate):
    """dx = dy * g: the gate depends on x too, so the product rule adds x * dg/dx to the derivative of x * g."""
    return dy * gate


def value_for_derivative(dy, x, gate):
    """dx = dy * x * g: the activation's value y = x * g times dy, where its derivative g + x * dg/dx belongs."""
    return dy * x * gate


def relu_derivative(dy, x, gate):
    """ReLU's derivative [x > 0] kept from the paper's network: this activation is smooth, its derivative is not 0 or 1."""
    return dy * (x > 0)


def activation_forgotten(dy, x, gate):
    """dx = dy: the activation's local derivative taken as 1, as if the layer passed x through unchanged."""
    return dy


MISTAKES = (gate_only, value_for_derivative, relu_derivative, activation_forgotten)


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    x = 3.0 * rng.standard_normal((3, 6, 8))
    rows = rng.standard_normal((4, 5))
    rows[0] = [-30.0, -8.0, 0.0, 8.0, 30.0]  # the gate saturated at both ends, and x = 0 exactly
    rows[1] = -np.abs(rows[1]) - 1.0          # a row all negative (where ReLU would pass nothing)
    layer = cls.__name__
    return [GradCase(layer, f"x {x.shape}", cls(), {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}),
            GradCase(layer, "|x| up to 30, x = 0, a row all negative", cls(), {"x": rows},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def activation_exercise(name: str) -> Exercise:
    """The exercise of the activation ``name``, from its row, its layer class and its layer file's functions."""
    row = ACTIVATIONS[name]
    module = import_module(row.module)
    layer = numformer_classes()[row.layer]
    forward = getattr(module, row.forward_name)
    equations = (inspect.getdoc(module) or "").split("\n\n")[0]
    return Exercise(
        name=name, title=f"{row.layer}'s backward", paper=f"Eq. 2 with {row.layer} for max(0, x)",
        stage="elementwise",
        target=getattr(module, row.backward_name), layer=layer, cases=cases, outputs=("dx",),
        # the module's functions but the backward and forward mode's (whose tangent is the derivative asked for)
        show=tuple(f for f in vars(module).values() if inspect.isfunction(f) and f.__module__ == module.__name__
                   and f.__name__ != row.backward_name and not f.__name__.endswith("_jvp")),
        swap=row.layer, mistakes=MISTAKES,
        notes="x is the forward's input and gate = g(x) as forward computed it, both of x's shape; dy and the "
              "result have x's shape.",
        forward=f"""
        {equations}

        The forward (shown below as {forward.__name__}) computes y = x * g elementwise, with the gate g a function
        of x alone, and keeps x and g. Your function receives dy = dL/dy (x's shape), x and gate = g (x's shape).
        It returns dx = dL/dx, of x's shape and dy's dtype.""",
        returns="Return dx = dL/dx, of x's shape, from dy (x's shape), the forward's input x and its gate g "
                "(x's shape).",
        steps=("The forward is elementwise: y_i depends on x_i alone, so dL/dx_i = dL/dy_i * dy_i/dx_i, and dx "
               "has x's shape. What remains is the local derivative dy_i/dx_i.",
               "y = x * g is a product of two functions of x: the product rule gives dy/dx = g + x * dg/dx. Do not "
               "stop at g: the gate is not a constant.",
               f"Differentiate the gate as {forward.__name__} computes it (the chain rule through each function it "
               "applies); the forward's g is given, reuse it where the derivative contains it.",
               "Whole backward: " + (inspect.getdoc(getattr(module, row.backward_name)) or "").replace("\n", " ")))
