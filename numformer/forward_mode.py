"""Forward mode: the parameters' tangents, given for the length of a block.

Reverse mode, what training runs, carries ``dL/dy`` backwards and adds ``dL/dtheta`` into ``Parameter.grad``.
Forward mode carries a direction of change forwards: given tangents ``x_dot`` of the inputs and ``theta_dot``
of the parameters, each layer's ``jvp`` returns its output's tangent ``y_dot = J_x x_dot + J_theta theta_dot``,
the directional derivative of its forward (the layer contract of :class:`numformer.module.Module`). A
layer reads its parameters' tangents from ``Parameter.tangent``, as its backward adds into ``Parameter.grad``;
this module gives them for a block::

    with tangents(model, {"encoder.layers.0.ffn.w_1.weight": v}):   # every other parameter: a zero tangent
        logits = model(src, tgt_in)                 # training mode: forward keeps what jvp and backward need
        logits_dot = model.jvp()                    # the logits' tangent along v
        loss = crit.forward(logits, tgt_out)
        loss_dot = crit.jvp(logits_dot)             # = <grad L, v>, the directional derivative of the loss
        model.backward_jvp(*crit.backward_jvp())    # backward and its tangent: Parameter.grad_tangent = H v

Forward over reverse (Pearlmutter 1994, "Fast exact multiplication by the Hessian"): the tangent of the
gradient along ``v`` is ``H v``, exact up to rounding, for one forward, one jvp and one backward with its
tangent, about three gradients' work. numformer/curvature/hvp.py builds the Hessian tools on it.
"""
from __future__ import annotations

import contextlib

from .backend import get_array_module
from .module import UNWANTED, ZERO


@contextlib.contextmanager
def tangents(module, directions=None, named=None, wanted=None):
    """Inside the block every parameter of ``module`` has ``Parameter.tangent`` = ``directions[name]`` (an
    array of its shape, cast to its dtype and device; a zero tangent for every name not given) and a zero
    ``Parameter.grad_tangent`` to add into; both are taken away at the end, an exception included.

    ``directions``: dotted parameter name (``module.named_parameters()``; a tied matrix under its first name)
    -> tangent. A name the module does not have is a KeyError naming it. ``wanted``: the names whose
    grad_tangent will be read (default: every parameter's); numformer's layers compute no other (the products
    of a block need the block's alone, and the terms of a zero tangent are left out too:
    ``Parameter.nonzero_tangent``, ``Parameter.wants_grad_tangent``). ``named``: the module's
    ``named_parameters()`` when the caller holds them already (a loop of products: the walk of a deep model's
    tree is not free)."""
    directions = dict(directions or {})
    named = module.named_parameters() if named is None else named
    unknown = sorted((set(directions) | set(wanted or ())) - {n for n, _ in named})
    if unknown:
        raise KeyError(f"no parameter {unknown[0]!r} to give a tangent to")
    wanted = None if wanted is None else set(wanted)
    try:
        for name, p in named:
            xp = get_array_module(p.data)
            given = directions.get(name)
            tangent = ZERO if given is None else xp.asarray(given, dtype=p.data.dtype)
            if tangent is not ZERO and tangent.shape != p.data.shape:
                raise ValueError(f"the tangent of {name} has shape {tuple(tangent.shape)}, the parameter "
                                 f"{tuple(p.data.shape)}")
            p.set_tangents(tangent, xp.zeros_like(p.data) if wanted is None or name in wanted else UNWANTED)
        yield module
    finally:
        for _, p in named:
            p.set_tangents(None, None)
