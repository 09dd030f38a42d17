"""Kinks: a piecewise layer (ReLU, not differentiable at 0) has no derivative where its input sits on a kink,
so a probe whose +h and -h forwards see different pieces straddles a kink and its difference quotient
measures nothing.

Which layers have kinks is declared, not guessed (the layer contract, :attr:`numformer.module.Module.kinks`):
a layer with ``kinks = True`` says which piece each element was on in its last training forward
(``active_set``: ReLU's ``[x > 0]``). :func:`active_set_signature` hashes the pieces every such layer saw in
a forward; :func:`~numformer.finite_differences.central_differences.run_case` compares it between the sides of
each probe and drops a probe where it differs. A layer that leaves ``kinks`` undeclared is checked as smooth
and named in :func:`~numformer.finite_differences.any_layer.check`'s report (:func:`undeclared`): a probe
across a kink nobody declared can make a right backward fail, never a wrong one pass, and refusing it would
refuse every hand-written layer that is not a numformer Module. The Hessian tools, where an undeclared kink
would silently give wrong numbers, refuse it instead (numformer/curvature/hvp.py).
"""
from __future__ import annotations

import numpy as np

from ..module import kink_declarations


def kinked(modules) -> list:
    """The layers among ``modules`` (a module's ``modules()``, or a foreign layer alone) declaring ``kinks =
    True``; one declaring it without ``active_set`` and ``forward_on_pieces`` is refused in one line
    (:class:`numformer.module.UndeclaredKinks`)."""
    return kink_declarations([("", m) for m in modules])[0]


def undeclared(named) -> list:
    """``named``: (name, layer) pairs. -> the leaf layers among them leaving ``kinks`` undeclared, as
    ``"Class (name)"``."""
    return kink_declarations(named)[1]


def _piece_bytes(pieces) -> bytes:
    pieces = np.asarray(pieces)
    return np.packbits(pieces).tobytes() if pieces.dtype == bool else pieces.tobytes()


def active_set_signature(module, modules=None) -> int:
    """A hash of the pieces (``active_set``) every layer declaring kinks in ``module`` saw in the last
    forward in training mode: two forwards with equal signatures took the same piece of every kink.
    ``modules``: the kinked layers, when the caller found them once already (:func:`kinked`); else every
    ``module.modules()`` declaring ``kinks = True``."""
    layers = kinked(module.modules()) if modules is None else modules
    return hash(b"|".join(b"-" if m.active_set is None else _piece_bytes(m.active_set) for m in layers))
