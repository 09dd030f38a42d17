"""The adjoint of a forward quantity by central differences: the value a student's ``dstd`` or ``dvar`` must hold.

A student's route through the forward's intermediates (LayerNorm through std and var + eps) computes gradients
numformer's closed form never forms; each is known all the same: the gradient of L = sum(dy * y) with respect to that
quantity of numformer's forward, the rest computed from it as the forward does. The recorded forward function
(``layernorm_forward``) runs once with the quantity moved by +-h at each entry (stacked along a new first axis, every
expression holding that value moved alike: ``x - mu`` is computed twice), and the change of L over 2h is that entry's
adjoint. Only for a function exercise with a forward beside it taking arrays and numbers (dropout's draws its mask),
whose first argument is the forward's first output's gradient, quantities of at most :data:`MOST` entries, and only
when a wrong answer's record of that size asks.
"""
from __future__ import annotations

import numpy as np

from .counterparts import same

MOST = 512      # entries of a quantity, per call, whose adjoint is computed (2 x MOST rows of one forward run)
STEP = 1e-6     # relative step of the central differences
CLOSE = 1e-6    # a student's value equals an adjoint within this fraction of its largest entry (the differences'
                # own error is about 1e-9 of it)


def adjoints(recordings):
    """:class:`Adjoints` of the exercise's forward, or None when it has no forward to difference."""
    from .first_wrong_step import forward_twin  # noqa: PLC0415  (the diagnosis' own)
    from .recorded_run import Recorder, recorded  # noqa: PLC0415

    twin = forward_twin(recordings.ex)
    recorder = Recorder()
    fn = recorded(twin, recorder) if twin is not None and recordings.forward else None
    return None if fn is None else Adjoints(fn, recorder)


class Adjoints:
    """``adjoints(engine, key) -> [Known]``: the adjoints of numformer's forward quantities with as many entries as
    the student's gradient-side record ``key`` (or a shape it broadcasts alike), in every call; each computed once."""

    def __init__(self, fn, recorder):
        self.fn, self.recorder, self.cache = fn, recorder, {}

    def __call__(self, engine, key) -> list:
        per_call = engine.records[key]
        n0, first = next(iter(per_call.items()))
        if first.value.ndim == 0 or not engine.gradient_side(n0, first) or not engine.forward:
            return []
        from .first_wrong_step import _broadcasts_alike  # noqa: PLC0415
        found = []
        for _, _, record in _classes(engine.forward[0]):
            if record.value.size != first.value.size and not _broadcasts_alike(first.value.shape, record.value.shape):
                continue  # (a row statistic kept over the other axis asks too: dmu (1, d) for mu (n, 1))
            if record.key not in self.cache:
                self.cache[record.key] = self._known(engine, record)
            if self.cache[record.key] is not None:
                found.append(self.cache[record.key])
        return found

    def _known(self, engine, record):
        from .first_wrong_step import Known  # noqa: PLC0415

        values = {}
        for n, call in enumerate(engine.forward):
            dy = engine.ref_calls[n].args.get(engine.first_param)
            here = next(((keys, value) for keys, value, _ in _classes(call) if record.key in keys), None)
            if not isinstance(dy, np.ndarray) or here is None or any(
                    not isinstance(a, (np.ndarray, int, float)) for a in call.args.values()):
                return None
            values[n] = self._adjoint(call, dy, *here)
            if values[n] is None:
                return None
        return Known("adjoint", values, f"dL/d({record.variable or record.code})",
                     f"the gradient of numformer's forward's `{record.code}`, by finite differences", record.variable)

    def _run(self, args, overrides):
        self.recorder.calls, self.recorder.overrides = [], overrides
        with np.errstate(all="ignore"):
            out = self.fn(**args)
        return out[0] if isinstance(out, tuple) else out

    def _adjoint(self, call, dy, keys, value) -> np.ndarray | None:
        """dL/d(value) at every entry: one run of the forward with every argument of two or more axes stacked 2 x
        size times along a new first axis (the forward works on rows: a leading axis is one more batch axis), the
        value moved by +h and -h at one entry in each; entry by entry when the forward does not take that."""
        h = STEP * max(float(np.abs(value).max()), 1e-3)
        k = value.size
        moved = np.repeat(value[None], 2 * k, axis=0).reshape(2 * k, k)
        moved[np.arange(k), np.arange(k)] += h
        moved[k + np.arange(k), np.arange(k)] -= h
        moved = moved.reshape(2 * k, *value.shape)
        args = {name: np.repeat(a[None], 2 * k, axis=0) if isinstance(a, np.ndarray) and a.ndim >= 2 else a
                for name, a in call.args.items()}
        try:
            y = np.asarray(self._run(args, {(0, key): moved for key in keys}), dtype=np.float64)
        except Exception:  # noqa: BLE001  (a forward that does not broadcast over a leading axis)
            y = None
        if y is None or y.shape != (2 * k, *dy.shape):
            sides = []
            for j in range(2 * k):
                one = np.asarray(self._run(call.args, {(0, key): moved[j] for key in keys}), dtype=np.float64)
                if one.shape != dy.shape:
                    return None
                sides.append(one)
            y = np.stack(sides)
        losses = (y * dy).reshape(2 * k, -1).sum(axis=1)
        return ((losses[:k] - losses[k:]) / (2 * h)).reshape(value.shape)


def _classes(call) -> list:
    """[(keys, the value, the first record)] of a forward call's values (no argument, no number), equal ones one
    class: every expression holding that value moves with it."""
    out = []
    for r in call.records:
        if r.given or r.kind == "name" or r.value.ndim == 0 or r.value.size > MOST:
            continue  # (a name passed on is a use of a quantity, not one)
        for keys, value, _ in out:
            if value.shape == r.value.shape and same(value, r.value):
                keys.append(r.key)
                break
        else:
            out.append(([r.key], r.value, r))
    return out
