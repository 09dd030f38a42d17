"""Checks every answer of manifest.json numerically, without the grader: each answer's backward (or
LayerNorm's JVP, or the tangent of its backward) against numformer's own on random float64 inputs
(padding, masks, fully masked rows, dropout, pre/post-LN, self/cross attention, prefilled gradients,
several hyper-parameters, tangents of gamma and beta present or None), its module loaded fresh and its
cases run in two orders (so that state kept from the first call shows). Prints one line per answer and
exits 1 when an answer's numeric verdict disagrees with its manifest entry.

    python3 bench/held_out_grading/verify.py [--only NN]
"""
import importlib.util
import itertools
import json
import math
import pathlib
import sys
import traceback

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the checkout's numformer and grad_checks
from numformer.cli.arguments import OneLineParser  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/held_out_grading/verify.py"  # the name its one-line errors start with
F64 = np.float64
_count = itertools.count()


def load(path):
    spec = importlib.util.spec_from_file_location(f"heldout_answer_{next(_count)}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def differs(a, b):
    """None when a equals b to round-off, else a short reason."""
    if a is None or b is None:
        return None if a is None and b is None else f"None vs {type(b).__name__ if a is None else 'None'}"
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    if not np.isfinite(err) or err > 1e-11 * scale:
        return f"max err {err:.2e} (scale {scale:.1f})"
    return None


def rng_of(seed):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- function exercises
# each case: a callable (fn) -> list of (name, student value, reference value)

def relu_cases():
    from numformer.layers.relu import relu_backward, relu_forward
    out = []
    for seed, shape in ((1, (3, 6, 8)), (2, (4, 5))):
        g = rng_of(seed)
        x = g.normal(size=shape)
        x.flat[::7] = 0.0
        _, pos = relu_forward(x)
        dy = g.normal(size=shape)
        out.append(lambda fn, dy=dy, pos=pos: [("dx", fn(dy.copy(), pos.copy()), relu_backward(dy, pos))])
    return out


def elementwise_cases(module, gate):
    ref = getattr(module, "silu_backward", None) or getattr(module, "gelu_backward", None) \
        or getattr(module, "gelu_tanh_backward", None)
    out = []
    for seed, shape, sd in ((3, (3, 6, 8), 2.0), (4, (4, 5), 4.0), (5, (7,), 0.5)):
        g = rng_of(seed)
        x = g.normal(scale=sd, size=shape)
        s = gate(x)
        dy = g.normal(size=shape)
        out.append(lambda fn, x=x, s=s, dy=dy: [("dx", fn(dy.copy(), x.copy(), s.copy()), ref(dy, x, s))])
    return out


def silu_cases():
    import numformer.layers.silu as m
    return elementwise_cases(m, m.sigmoid)


def gelu_cases():
    import numformer.layers.gelu as m
    return elementwise_cases(m, m.normal_cdf)


def gelu_tanh_cases():
    import numformer.layers.gelu_tanh as m
    return elementwise_cases(m, lambda x: m.gelu_tanh_forward(x)[1])


def linear_cases():
    from numformer.layers.linear import linear_backward
    out = []
    for seed, n, di, do, bias in ((6, 12, 7, 5, True), (7, 10, 6, 6, True), (8, 6, 4, 6, False), (9, 3, 9, 2, True)):
        g = rng_of(seed)
        x, w, dy = g.normal(size=(n, di)), g.normal(size=(di, do)), g.normal(size=(n, do))

        def case(fn, x=x, w=w, dy=dy, bias=bias):
            mine, ref = fn(dy.copy(), x.copy(), w.copy(), bias), linear_backward(dy, x, w, bias)
            return [(nm, a, b) for nm, a, b in zip(("dx", "dW", "db"), mine, ref)]
        out.append(case)
    return out


def softmax_cases():
    from numformer.layers.softmax import softmax, softmax_backward
    out = []
    for seed, shape in ((10, (3, 4, 5, 6)), (11, (2, 3, 7)), (12, (4, 1)), (13, (5, 5))):
        g = rng_of(seed)
        y = softmax(g.normal(scale=2.0, size=shape))
        dy = g.normal(size=shape)
        out.append(lambda fn, y=y, dy=dy: [("dx", fn(dy.copy(), y.copy()), softmax_backward(dy, y))])
    return out


def loss_cases():
    from numformer.layers.softmax import softmax
    from numformer.loss import smoothed_cross_entropy_backward as ref
    out = []
    for seed, n, v, eps, norm in ((14, 15, 13, 0.1, None), (15, 12, 9, 0.3, None), (16, 12, 11, 0.1, 20.0),
                                  (17, 8, 6, 0.0, None)):
        g = rng_of(seed)
        p = softmax(g.normal(size=(n, v)))
        y = g.integers(0, v, size=n)
        y[::4] = 0  # pad id 0
        keep = (y != 0).astype(F64)
        weight = keep / (norm if norm is not None else max(keep.sum(), 1.0))
        out.append(lambda fn, p=p, y=y, eps=eps, w=weight: [("dz", fn(p.copy(), y.copy(), eps, w.copy()),
                                                              ref(p.copy(), y, eps, w))])
    return out


def layernorm_cases():
    from numformer.layers.layernorm import layernorm_backward, layernorm_forward
    out = []
    for seed, n, d, sd in ((18, 18, 8, 1.0), (19, 2, 16, 0.01), (20, 5, 3, 3.0), (21, 8, 8, 1.0)):
        g = rng_of(seed)
        x = g.normal(scale=sd, size=(n, d)) + g.normal()
        gamma, beta = g.normal(size=d), g.normal(size=d)
        _, xhat, r = layernorm_forward(x, gamma, beta, 1e-5)
        dy = g.normal(size=(n, d))

        def case(fn, dy=dy, xhat=xhat, r=r, gamma=gamma):
            mine = fn(dy.copy(), xhat.copy(), r.copy(), gamma.copy())
            ref = layernorm_backward(dy, xhat, r, gamma)
            return [(nm, a, b) for nm, a, b in zip(("dx", "dgamma", "dbeta"), mine, ref)]
        out.append(case)
    return out


def layernorm_jvp_cases():
    from numformer.layers.layernorm import layernorm_forward, layernorm_jvp
    out = []
    for seed, n, d, sd, with_gd, with_bd in ((80, 18, 8, 1.0, True, True), (81, 2, 16, 0.01, False, True),
                                             (82, 5, 3, 3.0, True, False), (83, 8, 8, 1.0, False, False)):
        g = rng_of(seed)
        x = g.normal(scale=sd, size=(n, d)) + g.normal()
        gamma, beta = g.normal(size=d), g.normal(size=d)
        _, xhat, r = layernorm_forward(x, gamma, beta, 1e-5)
        x_dot = g.normal(size=(n, d))
        gd = g.normal(size=d) if with_gd else None
        bd = g.normal(size=d) if with_bd else None

        def case(fn, x_dot=x_dot, xhat=xhat, r=r, gamma=gamma, gd=gd, bd=bd):
            cp = lambda a: None if a is None else a.copy()
            mine = fn(x_dot.copy(), xhat.copy(), r.copy(), gamma.copy(), cp(gd), cp(bd))
            ref = layernorm_jvp(x_dot, xhat, r, gamma, gd, bd)
            return [(nm, a, b) for nm, a, b in zip(("y_dot", "xhat_dot", "r_dot"), mine, ref)]
        out.append(case)
    return out


def layernorm_rop_cases():
    from numformer.layers.layernorm import layernorm_backward_jvp, layernorm_forward, layernorm_jvp
    out = []
    for seed, n, d, sd, with_gd, params in ((84, 18, 8, 1.0, True, True), (85, 2, 16, 0.01, False, True),
                                            (86, 5, 3, 3.0, True, False), (87, 8, 8, 1.0, False, True)):
        g = rng_of(seed)
        x = g.normal(scale=sd, size=(n, d)) + g.normal()
        gamma, beta = g.normal(size=d), g.normal(size=d)
        _, xhat, r = layernorm_forward(x, gamma, beta, 1e-5)
        x_dot = g.normal(size=(n, d))
        gd = g.normal(size=d) if with_gd else None
        _, xhat_dot, r_dot = layernorm_jvp(x_dot, xhat, r, gamma, gd, None)
        dy, dy_dot = g.normal(size=(n, d)), g.normal(size=(n, d))

        def case(fn, dy=dy, dy_dot=dy_dot, xhat=xhat, r=r, gamma=gamma, xd=xhat_dot, rd=r_dot, gd=gd, params=params):
            cp = lambda a: None if a is None else a.copy()
            mine = fn(dy.copy(), dy_dot.copy(), xhat.copy(), r.copy(), gamma.copy(), xd.copy(), rd.copy(), cp(gd),
                      params)
            ref = layernorm_backward_jvp(dy, dy_dot, xhat, r, gamma, xd, rd, gd, params)
            return [(nm, a, b) for nm, a, b in zip(("dx_dot", "dgamma_dot", "dbeta_dot"), mine, ref)]
        out.append(case)
    return out


def dropout_cases():
    from numformer.backend import RandomState
    from numformer.layers.dropout import dropout_backward, dropout_mask
    out = []
    for seed, shape, p in ((22, (3, 6, 8), 0.3), (23, (4, 10), 0.5), (24, (5, 7), 0.1)):
        mask = dropout_mask(RandomState(seed), shape, p, F64)
        dy = rng_of(seed).normal(size=shape)
        out.append(lambda fn, dy=dy, mask=mask: [("dx", fn(dy.copy(), mask.copy()), dropout_backward(dy, mask))])
    return out


def embedding_cases():
    from numformer.layers.embedding import embedding_backward
    out = []
    for seed, V, d, n, scaled in ((25, 13, 8, 20, True), (26, 13, 8, 9, False), (27, 7, 4, 30, True)):
        g = rng_of(seed)
        grad0 = g.normal(size=(V, d))
        ids = g.integers(0, V, size=n)
        ids[:3] = ids[3]  # repeated ids
        dy = g.normal(size=(n, d))
        scale = math.sqrt(d) if scaled else 1.0

        def case(fn, grad0=grad0, ids=ids, dy=dy, scale=scale):
            mine_grad = grad0.copy()
            ret = fn(mine_grad, ids.copy(), dy.copy(), scale)
            ref = embedding_backward(grad0.copy(), ids, dy, scale)
            return [("grad in place", mine_grad, ref), ("returned", ret, ref)]
        out.append(case)
    return out


def learned_positions_cases():
    from numformer.layers.learned_positions import learned_positions_backward as ref
    out = []
    for seed, max_len, shape, offset in ((28, 16, (3, 6, 8), 3), (29, 16, (3, 5, 8), 1), (30, 10, (2, 4, 8), 6),
                                         (31, 12, (2, 3, 4, 8), 0)):
        g = rng_of(seed)
        grad0 = g.normal(size=(max_len, shape[-1]))
        dy = g.normal(size=shape)

        def case(fn, grad0=grad0, dy=dy, offset=offset):
            mine_grad = grad0.copy()
            got = fn(mine_grad, dy.copy(), offset)
            rgrad, rdx = ref(grad0.copy(), dy.copy(), offset)
            return [("grad in place", mine_grad, rgrad), ("grad returned", got[0], rgrad), ("dx", got[1], rdx)]
        out.append(case)
    return out


def attention_cases():
    from numformer.backend import RandomState
    from numformer.layers.attention import attention_backward, attention_forward
    from numformer.layers.dropout import dropout_mask
    out = []
    specs = ((32, 5, 6, 4, 3, "padding+full", None), (33, 5, 5, 4, 3, "causal", None),
             (34, 5, 6, 4, 4, "padding", 0.2), (35, 4, 4, 2, 2, None, None), (36, 3, 7, 5, 2, "padding", None))
    for seed, tq, tk, dk, dv, mk, pdrop in specs:
        g = rng_of(seed)
        B, h = 3, 2
        q, k, v = g.normal(size=(B, h, tq, dk)), g.normal(size=(B, h, tk, dk)), g.normal(size=(B, h, tk, dv))
        dout = g.normal(size=(B, h, tq, dv))
        masked = None
        if mk is not None:
            allowed = np.ones((B, 1, tq, tk), bool)
            if "padding" in mk:
                allowed[1, :, :, -2:] = False
            if mk == "causal":
                allowed &= np.tril(np.ones((tq, tk), bool))
            if "full" in mk:
                allowed[2, :, 1, :] = False
            masked = ~allowed
        scale = 1.0 / math.sqrt(dk)
        m = None if pdrop is None else dropout_mask(RandomState(seed), (B, h, tq, tk), pdrop, F64)
        drop = None if m is None else (lambda p, m=m: p * m)
        _, p, p_used = attention_forward(q, k, v, masked, scale, drop)
        dback = None if m is None else (lambda gg, m=m: gg * m)

        def case(fn, q=q, k=k, v=v, p=p, pu=p_used, masked=masked, scale=scale, db=dback, dout=dout):
            cp = lambda a: None if a is None else a.copy()
            mine = fn(dout.copy(), q.copy(), k.copy(), v.copy(), p.copy(), pu.copy(), cp(masked), scale, db)
            ref = attention_backward(dout, q, k, v, p, pu, masked, scale, db)
            return [(nm, a, b) for nm, a, b in zip(("dq", "dk", "dv"), mine, ref)]
        out.append(case)
    return out


# ---------------------------------------------------------------- composites

def grads_of(*modules):
    out = {}
    for i, m in enumerate(modules):
        for name, prm in m.named_parameters():
            out[f"{i}.{name}"] = prm.grad.copy()
    return out


def compare_grads(mine, ref):
    return [(f"grad {k}", mine[k], ref[k]) for k in ref]


def multihead_cases(student_mod):
    from numformer.backend import RandomState
    from numformer.layers.attention import MultiHeadAttention as Ref
    out = []
    specs = ((40, False, 8, 2, None, None, 0.0, "padding"), (41, False, 8, 2, None, None, 0.0, "causal"),
             (42, True, 8, 4, 3, 5, 0.0, "padding"), (43, True, 8, 2, None, None, 0.2, "padding"),
             (44, False, 6, 3, 4, 2, 0.1, "causal"))
    for seed, cross, d, h, dk, dv, ad, mk in specs:
        def case(_mod, seed=seed, cross=cross, d=d, h=h, dk=dk, dv=dv, ad=ad, mk=mk):
            g = rng_of(seed + 1000)
            B, T, S = 3, 5, 6
            x = g.normal(size=(B, T, d))
            mem = g.normal(size=(B, S, d)) if cross else None
            tk = S if cross else T
            mask = np.ones((B, 1, 1, tk), bool)
            mask[1, ..., -2:] = False
            if mk == "causal":
                mask = mask & np.tril(np.ones((T, tk), bool))[None, None]
            dy = g.normal(size=(B, T, d))
            res = []
            for cls in (Ref, _mod.MultiHeadAttention):
                layer = cls(d, h, dk, dv, ad, rng_of(seed), RandomState(seed), F64)
                layer.train()
                for _, prm in layer.named_parameters():  # non-zero biases
                    prm.data[...] = rng_of(seed + 7).normal(size=prm.shape) * 0.5 + prm.data * 0
                    break
                layer.forward(x.copy(), None if mem is None else mem.copy(), mask)
                got = layer.backward(dy.copy())
                res.append((got, grads_of(layer)))
            (rgot, rg), (mgot, mg) = res
            pairs = compare_grads(mg, rg)
            if cross:
                if not (isinstance(mgot, tuple) and len(mgot) == 2):
                    return pairs + [("return", np.zeros(1), np.zeros(2))]
                pairs += [("dx", mgot[0], rgot[0]), ("dmemory", mgot[1], rgot[1])]
            else:
                pairs += [("dx", mgot, rgot)]
            return pairs
        out.append(case)
    return out


def residual_cases(student_mod):
    from numformer.backend import RandomState
    from numformer.layers.attention import MultiHeadAttention
    from numformer.layers.feedforward import FeedForward
    from numformer.layers.sublayer import Residual as Ref
    out = []
    for seed, pre, kind in ((50, False, "ffn"), (51, True, "ffn"), (52, False, "cross"), (53, True, "cross"),
                            (54, True, "self"), (55, False, "self")):
        def case(_mod, seed=seed, pre=pre, kind=kind):
            g = rng_of(seed + 1000)
            B, T, S, d = 3, 5, 6, 8
            x = g.normal(size=(B, T, d))
            mem = g.normal(size=(B, S, d))
            mask = np.ones((B, 1, 1, S if kind == "cross" else T), bool)
            mask[2, ..., -1] = False
            dy = g.normal(size=(B, T, d))
            gam, bet = g.normal(size=d), g.normal(size=d)
            res = []
            for cls in (Ref, _mod.Residual):
                r = cls(d, 0.1, pre, RandomState(seed), 1e-5, F64)
                r.norm.weight.data[...] = gam
                r.norm.bias.data[...] = bet
                if kind == "ffn":
                    sub = FeedForward(d, 16, 0.0, rng_of(seed), None, F64)
                else:
                    sub = MultiHeadAttention(d, 2, None, None, 0.0, rng_of(seed), None, F64)
                r.train(), sub.train()
                if kind == "ffn":
                    r.forward(x.copy(), sub)
                elif kind == "cross":
                    r.forward(x.copy(), sub, mem.copy(), mask=mask)
                else:
                    r.forward(x.copy(), sub, mask=mask)
                got = r.backward(dy.copy(), sub)
                res.append((got, grads_of(r, sub)))
            (rgot, rg), (mgot, mg) = res
            pairs = compare_grads(mg, rg)
            if isinstance(rgot, tuple):
                if not (isinstance(mgot, tuple) and len(mgot) == len(rgot)):
                    return pairs + [("return", np.zeros(1), np.zeros(2))]
                pairs += [(f"out{i}", a, b) for i, (a, b) in enumerate(zip(mgot, rgot))]
            else:
                pairs += [("dx", mgot, rgot)]
            return pairs
        out.append(case)
    return out


def layer_cfg(pre, attn_dropout=0.0):
    from numformer.presets import ModelConfig
    return ModelConfig(vocab_size=20, d_model=8, d_ff=16, heads=2, layers=1, dropout=0.1, pre_norm=pre,
                       attn_dropout=attn_dropout)


def encoder_layer_cases(student_mod):
    from numformer.backend import RandomState
    from numformer.model import EncoderLayer as Ref
    out = []
    for seed, pre, ad in ((60, False, 0.0), (61, True, 0.0), (62, False, 0.1)):
        def case(_mod, seed=seed, pre=pre, ad=ad):
            g = rng_of(seed + 1000)
            B, S, d = 3, 6, 8
            x, dy = g.normal(size=(B, S, d)), g.normal(size=(B, S, d))
            mask = np.ones((B, 1, 1, S), bool)
            mask[1, ..., -2:] = False
            res = []
            for cls in (Ref, _mod.EncoderLayer):
                layer = cls(layer_cfg(pre, ad), rng_of(seed), RandomState(seed), F64)
                layer.train()
                layer.forward(x.copy(), mask)
                got = layer.backward(dy.copy())
                res.append((got, grads_of(layer)))
            (rgot, rg), (mgot, mg) = res
            return compare_grads(mg, rg) + [("dx", mgot, rgot)]
        out.append(case)
    return out


def decoder_layer_cases(student_mod):
    from numformer.backend import RandomState
    from numformer.model import DecoderLayer as Ref
    out = []
    for seed, pre, ad in ((70, False, 0.0), (71, True, 0.0), (72, False, 0.1)):
        def case(_mod, seed=seed, pre=pre, ad=ad):
            g = rng_of(seed + 1000)
            B, T, S, d = 3, 5, 6, 8
            y, mem, dy = g.normal(size=(B, T, d)), g.normal(size=(B, S, d)), g.normal(size=(B, T, d))
            self_mask = np.tril(np.ones((T, T), bool))[None, None] & np.ones((B, 1, 1, T), bool)
            self_mask = self_mask.copy()
            self_mask[1, :, :, -1] = False
            self_mask[2, :, 0, :] = False  # a fully masked row
            cross_mask = np.ones((B, 1, 1, S), bool)
            cross_mask[0, ..., -2:] = False
            res = []
            for cls in (Ref, _mod.DecoderLayer):
                layer = cls(layer_cfg(pre, ad), rng_of(seed), RandomState(seed), F64)
                layer.train()
                layer.forward(y.copy(), mem.copy(), self_mask, cross_mask)
                got = layer.backward(dy.copy())
                res.append((got, grads_of(layer)))
            (rgot, rg), (mgot, mg) = res
            pairs = compare_grads(mg, rg)
            if not (isinstance(mgot, tuple) and len(mgot) == 2):
                return pairs + [("return", np.zeros(1), np.zeros(2))]
            return pairs + [("dy", mgot[0], rgot[0]), ("dmemory", mgot[1], rgot[1])]
        out.append(case)
    return out


FUNCTIONS = {"relu": ("relu_backward", relu_cases), "silu": ("silu_backward", silu_cases),
             "gelu": ("gelu_backward", gelu_cases), "gelu_tanh": ("gelu_tanh_backward", gelu_tanh_cases),
             "linear": ("linear_backward", linear_cases), "softmax": ("softmax_backward", softmax_cases),
             "loss": ("smoothed_cross_entropy_backward", loss_cases),
             "layernorm": ("layernorm_backward", layernorm_cases), "dropout": ("dropout_backward", dropout_cases),
             "embedding": ("embedding_backward", embedding_cases),
             "learned_positions": ("learned_positions_backward", learned_positions_cases),
             "attention": ("attention_backward", attention_cases),
             "layernorm_jvp": ("layernorm_jvp", layernorm_jvp_cases),
             "layernorm_rop": ("layernorm_backward_jvp", layernorm_rop_cases)}
COMPOSITES = {"multihead": multihead_cases, "residual": residual_cases, "encoder_layer": encoder_layer_cases,
              "decoder_layer": decoder_layer_cases}


def run_entry(path, exercise):
    """-> list of problems (empty: right on every case in both orders)."""
    problems = []
    if exercise in FUNCTIONS:
        fname, make = FUNCTIONS[exercise]
        cases = make()
        call = lambda mod, case: case(getattr(mod, fname))
    else:
        cases = COMPOSITES[exercise](None)
        call = lambda mod, case: case(mod)
    for order_name, order in (("forward order", list(range(len(cases)))),
                              ("reverse order", list(reversed(range(len(cases)))))):
        mod = load(path)
        for ci in order:
            try:
                pairs = call(mod, cases[ci])
            except Exception as exc:  # a wrong answer may raise
                problems.append(f"{order_name} case {ci + 1}: raises {type(exc).__name__}: {exc}"[:160])
                continue
            for name, mine, ref in pairs:
                why = differs(mine, ref)
                if why:
                    problems.append(f"{order_name} case {ci + 1}: {name}: {why}")
    return problems


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description="Checks every held-out answer against its manifest, without the grader.")
    ap.add_argument("--only", default=None, help="the file number prefix (e.g. 07) to check alone")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--manifest", default=str(HERE / "manifest.json"),
                    help="the set's manifest.json (its files are named relative to it)")
    args = ap.parse_args(argv)
    manifest_path = pathlib.Path(args.manifest).resolve()
    manifest = json.loads(manifest_path.read_text())
    bad = 0
    for e in manifest:
        if args.only and not pathlib.Path(e["file"]).name.startswith(args.only):
            continue
        problems = run_entry(manifest_path.parent / e["file"], e["exercise"])
        numeric_right = not problems
        ok = numeric_right == e["right"]
        bad += not ok
        verdict = "right" if numeric_right else "wrong"
        print(f"{'ok ' if ok else 'BAD'} {e['file']:<50} manifest {'right' if e['right'] else 'wrong'}, "
              f"numerically {verdict}" + ("" if numeric_right else f" ({len(problems)} problems: {problems[0]})"))
        if args.verbose and problems:
            for p in problems:
                print("      ", p)
    print(f"{bad} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
