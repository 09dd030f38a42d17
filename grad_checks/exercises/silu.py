"""Exercise: SiLU's backward (Marian's feed-forward activation, "swish": Eq. 2 with x * sigmoid(x) for max(0, x))."""
from __future__ import annotations

from numformer.layers.silu import SiLU, sigmoid, silu_backward, silu_forward

from ..exercise import Exercise
from .activation import cases  # every gated activation's cases: SiLU's gate saturated at both ends, x = 0


def sigmoid_only(dy, x, s):
    """dx = dy * s: s depends on x too, so the product rule adds x * ds/dx to the derivative of x * s."""
    return dy * s


def derivative_without_dy(dy, x, s):
    """The local derivative returned alone: the chain rule multiplies it by dy."""
    return s + x * s * (1 - s)


def sigmoid_derivative_taken_as_s(dy, x, s):
    """ds/dx taken as s (as if s were exp(x)): the sigmoid's derivative is s * (1 - s)."""
    return dy * (s + x * s)


def second_term_subtracted(dy, x, s):
    """The product rule's second term enters with a minus: d(x * s)/dx = s + x * ds/dx, both terms added."""
    return dy * (s - x * s * (1 - s))


def relu_derivative(dy, x, s):
    """ReLU's derivative [x > 0] kept from the paper's network: SiLU is smooth, its derivative is not 0 or 1."""
    return dy * (x > 0)


EXERCISE = Exercise(
    stage="elementwise",
    name="silu", title="SiLU's backward", paper="Eq. 2, Marian's swish", target=silu_backward, layer=SiLU,
    cases=cases, outputs=("dx",), show=(sigmoid, silu_forward), swap="SiLU",
    mistakes=(sigmoid_only, derivative_without_dy, sigmoid_derivative_taken_as_s, second_term_subtracted,
              relu_derivative),
    notes="x is the forward's input and s = sigmoid(x) as forward computed it, both of x's shape; dy and the "
          "result have x's shape.",
    forward="""
        The activation of the feed-forward network in Marian's translation models (the opus-mt family): Eq. 2,
        FFN(x) = act(x W1 + b1) W2 + b2, with SiLU ("swish") in place of the paper's max(0, x), applied elementwise
        to an array x of any shape:

            s_i = sigmoid(x_i) = 1 / (1 + exp(-x_i))
            y_i = x_i * s_i

        Forward keeps x and s (the sigmoid is computed without overflow: see sigmoid below). Unlike ReLU, SiLU is
        smooth everywhere: no kink, nothing is switched off.

        Your function receives dy = dL/dy (x's shape), x and s (x's shape). It returns dx = dL/dx, of x's shape
        and dy's dtype.""",
    returns="Return dx = dL/dx, of x's shape, from dy (x's shape), the forward's input x and s = sigmoid(x) "
            "(x's shape).",
    steps=("The forward is elementwise: y_i depends on x_i alone, so the chain rule has no sum over other "
           "entries: dL/dx_i = dL/dy_i * dy_i/dx_i, and dx has x's shape. What remains is the local derivative "
           "dy_i/dx_i.",
           "y = x * s is a product of two functions of x: the product rule gives dy/dx = s + x * ds/dx. Do not "
           "stop at s: s is not a constant.",
           "The sigmoid's derivative: s = 1 / (1 + e) with e = exp(-x), so ds/dx = e / (1 + e)^2 = s * (e / (1 + e)) "
           "= s * (1 - s). Written with the s forward kept, it costs no exponential.",
           "Whole backward: dx = dy * (s + x * s * (1 - s)), elementwise; both terms added, then times dy. In "
           "NumPy that one line works on float32 and float64 alike and never overflows (s is in [0, 1])."))
