#!/usr/bin/env python3
"""Builds docs/study.ipynb, the notebook for people who study gradients, and runs it top to bottom.

    python docs/build_study.py            # write docs/study.ipynb with fresh outputs (pictures embedded)
    python docs/build_study.py --check    # exit 1 if docs/study.ipynb's cells differ from CELLS below

CELLS is the notebook's source: edit it here, then rebuild, so the committed notebook always holds the
outputs of its own code. tests/checks/test_study_notebook.py runs the notebook in CI (nbclient) and checks that
its cells are these. The notebook uses numformer's public names only: layer classes with forward and
backward, numformer.finite_differences.run_case and check, grad_checks.cases.build_cases, the exercises' grading
(grad_checks.exercises, grad_checks.grading.grade), train.py and translate.py's functions, numformer.plot and
numformer.attention_maps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "study.ipynb"

CELLS = [
    ("markdown", """\
# Studying the gradients of a Transformer, one layer at a time

This notebook follows the order a student learns backpropagation in, on numformer, a NumPy Transformer
("Attention Is All You Need", Vaswani et al. 2017) whose every backward pass is written by hand:

1. one layer's forward and backward, next to the formula written out in NumPy;
2. its finite-difference check;
3. the same check for the whole model and its loss;
4. a short training run, and pictures of how gradients flow through it;
5. attention maps of the trained model;
6. checking a backward pass of your own, and the exercises that grade it and name the mistake;
7. a study from the literature, rerun;
8. beyond the mean gradient: every sentence's gradient, the noise scale, the curvature of a block.

It runs top to bottom in a few minutes on a laptop CPU (CI runs it on every change)."""),
    ("code", """\
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import Image, display

# the repository root (this notebook lives in docs/), so that numformer, grad_checks and train.py import
ROOT = Path.cwd().resolve()
while not (ROOT / "numformer").is_dir() and ROOT != ROOT.parent:
    ROOT = ROOT.parent
sys.path.insert(0, str(ROOT))
np.set_printoptions(precision=4, suppress=True)"""),
    ("markdown", """\
## 1. One layer by hand: LayerNorm

Layer normalisation (used after every sub-layer, Section 3.1) normalises each position's vector over its
`d` features, then scales and shifts it:

$$\\mu = \\tfrac1d \\textstyle\\sum_i x_i,\\quad \\sigma^2 = \\tfrac1d \\textstyle\\sum_i (x_i-\\mu)^2,\\quad
\\hat x = \\frac{x-\\mu}{\\sqrt{\\sigma^2+\\epsilon}},\\quad y = \\gamma \\odot \\hat x + \\beta.$$

With an upstream gradient $g = \\partial L / \\partial y$, the backward pass is
$\\partial L/\\partial\\gamma = \\sum g \\odot \\hat x$, $\\partial L/\\partial\\beta = \\sum g$ (summed over
batch and time) and, with $\\hat g = g \\odot \\gamma$,

$$\\frac{\\partial L}{\\partial x} = \\frac{1}{\\sqrt{\\sigma^2+\\epsilon}}
\\Big(\\hat g - \\operatorname{mean}(\\hat g) - \\hat x \\operatorname{mean}(\\hat g \\odot \\hat x)\\Big).$$

numformer's `LayerNorm` has `forward(x)` and `backward(dy)`: backward returns $\\partial L/\\partial x$ and adds
the parameter gradients into `weight.grad` ($\\gamma$) and `bias.grad` ($\\beta$)."""),
    ("code", """\
from numformer.layers import LayerNorm

rng = np.random.default_rng(0)
d = 8
ln = LayerNorm(d, dtype=np.float64)
ln.weight.data[:] = rng.standard_normal(d)   # a random gain and bias: ones and zeros would hide mistakes
ln.bias.data[:] = rng.standard_normal(d)
x = 3.0 * rng.standard_normal((2, 5, d)) + 1.0   # (batch, time, d_model)
g = rng.standard_normal((2, 5, d))               # a random upstream gradient dL/dy (L = sum(y * g))

ln.train()
ln.zero_grad()
y = ln.forward(x)
dx = ln.backward(g)

# the same by hand
eps = 1e-5
mu = x.mean(-1, keepdims=True)
var = x.var(-1, keepdims=True)
xhat = (x - mu) / np.sqrt(var + eps)
y_hand = ln.weight.data * xhat + ln.bias.data
ghat = g * ln.weight.data
dx_hand = (ghat - ghat.mean(-1, keepdims=True) - xhat * (ghat * xhat).mean(-1, keepdims=True)) / np.sqrt(var + eps)

print("y      max |numformer - by hand|:", np.abs(y - y_hand).max())
print("dL/dx  max |numformer - by hand|:", np.abs(dx - dx_hand).max())
print("dL/dgamma                       :", np.abs(ln.weight.grad - (g * xhat).sum((0, 1))).max())
print("dL/dbeta                        :", np.abs(ln.bias.grad - g.sum((0, 1))).max())"""),
    ("markdown", """\
## 2. Its finite-difference check

A gradient formula is only as good as its check. Nudge one input entry by $\\pm h$ and compare the change
of $L$ with the analytic gradient (central differences, float64, $h = 10^{-5}$); the relative error
$|a-n| / (|a|+|n|)$ should be around $10^{-9}$ or less, far below the $10^{-6}$ the checks allow."""),
    ("code", """\
def loss(x_in):
    return float(np.sum(ln.forward(x_in) * g))

h = 1e-5
for i in [(0, 0, 0), (1, 2, 5), (1, 4, 7)]:
    xp, xm = x.copy(), x.copy()
    xp[i] += h
    xm[i] -= h
    numeric = (loss(xp) - loss(xm)) / (2 * h)
    print(f"x{i}: analytic {dx[i]:+.10f}  numerical {numeric:+.10f}  "
          f"relative error {abs(dx[i] - numeric) / (abs(dx[i]) + abs(numeric)):.1e}")"""),
    ("markdown", """\
`numformer.finite_differences.run_case` does this for every tensor of a layer, inputs and parameters, entry by
entry for small tensors and on random entries and random directions for large ones. `grad_checks.cases`
holds the cases `python -m grad_checks` runs: here LayerNorm's and the attention's (with padding and
causal masks)."""),
    ("code", """\
from grad_checks.cases import build_cases
from numformer.finite_differences import run_case

def table(results):
    for r in results:
        print(f"{r.layer:<26} {r.tensor:<10} {str(r.shape):<16} probes {r.probes:>4}  "
              f"worst rel err {r.max_rel_error:.1e}  {'pass' if r.passed else 'FAIL'}")

check_rng = np.random.default_rng(0)
for case in build_cases(["LayerNorm", "ScaledDotProductAttention"]):
    table(run_case(case, check_rng))"""),
    ("markdown", """\
## 3. The whole model

The same check on the whole Transformer and its label-smoothed loss (a small configuration in float64, dropout
replayed with fixed masks, padding in the batch): every parameter tensor, through the encoder, the decoder,
the tied embeddings and the output projection. This is the first of the model's cases; `python -m grad_checks`
runs them all (pre-LN, untied, learned positions, other dropouts)."""),
    ("code", """\
import time

start = time.perf_counter()
results = run_case(build_cases(["Transformer"])[0], check_rng)
worst = max(results, key=lambda r: r.max_rel_error)
print(f"{len(results)} tensors checked in {time.perf_counter() - start:.0f} s, "
      f"{sum(not r.passed for r in results)} failed; worst relative error {worst.max_rel_error:.1e} "
      f"({worst.tensor} in '{worst.case}')")"""),
    ("markdown", """\
## 4. A short training run, and how the gradients flow

`train.py` trains the `tiny` preset (d_model 128, 2 + 2 layers, its recipe: warmup 200, half the learning
rate of Eq. 3) for 500 steps of 1,000-token batches on the synthetic copy task (output = input), with
`--log-grads 25`: every 25 steps it records each tensor's gradient norm, the size of Adam's update relative
to the weight, and activation statistics. The run takes one to two minutes on a 2-core CPU."""),
    ("code", """\
run = Path(tempfile.mkdtemp()) / "copy-tiny"
cmd = [sys.executable, str(ROOT / "train.py"), "--task", "copy", "--preset", "tiny", "--max-steps", "500",
       "--max-tokens", "1000", "--log-grads", "25", "--save-every", "250", "--eval-every", "0",
       "--average-last", "1", "--no-test", "--no-progress", "--out", str(run)]
done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
print(done.stdout[-1500:] or done.stderr[-1500:])
assert done.returncode == 0"""),
    ("markdown", """\
The learning curve, then the gradient norm of every tensor (rows, in network order) at every logged step
(columns, colour = log10 of the norm): a tensor whose gradient vanishes shows as a dark row. The dark rows
here are the attention key biases, and they are right: a key bias adds the same amount to every score of a
query, the softmax does not change when all its inputs shift together, so their true gradient is zero (what
is left is round-off, around $10^{-10}$). Then the update-to-weight ratio per layer (around $10^{-3}$ is the
usual healthy range) and the activations."""),
    ("code", """\
from numformer.plot import plot_run

for picture in plot_run(run):
    display(Image(filename=str(picture)))"""),
    ("markdown", """\
## 5. Attention maps of the trained model

`numformer.attention_maps` translates a sentence, then runs the model once more on its own translation and
draws every head's attention weights (rows: queries, columns: keys). A model that copies should attend
from each output position to the source position it copies: a diagonal in the encoder-decoder attention."""),
    ("code", """\
from numformer.attention_maps import attention_pictures
from numformer.checkpoint.trained_model import load_model
from numformer.decoding.translation import DecodeOptions, translate_lines

model, vocab, path = load_model(run)
sentence = "t h e q u i c k f o x"
print("translation:", translate_lines(model, vocab, [sentence], DecodeOptions(beam=1))[0])
for picture in attention_pictures(model, vocab, sentence, run / "attention.png", DecodeOptions(beam=1)):
    if picture.name.endswith("-cross.png"):
        display(Image(filename=str(picture)))"""),
    ("markdown", """\
Where to go next: `docs/backward.md` derives the attention and LayerNorm backward passes line by line,
`python -m grad_checks --verbose` checks every layer, and `python -m numformer.plot RUN` draws these
pictures for any run trained with `--log-grads N`."""),
]

# --- Section 7: a study from the literature (numformer/studies/ln_placement.py; docs/studies.md) -----------------
# Its own cells, placed before the closing "Where to go next" cell. The notebook runs the study's small
# configuration (the one its CI test runs: seconds); the full study is one command.
LN_PLACEMENT_CELLS = [
    ("markdown", """\
## 7. A study from the literature: where LayerNorm sits

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture", Figure 3 and Theorem 1) showed
that at initialisation the gradient of each layer's feed-forward weights grows toward the output in a
post-LN Transformer (the paper's `LN(x + F(x))`) and stays about flat in a pre-LN one (`x + F(LN(x))`),
which is why post-LN needs a learning-rate warm-up. `numformer.studies.ln_placement` measures it on
numformer: the gradient norm of every layer's $W_2$ at initialisation, both placements, both of numformer's
initialisations (`xavier`, the theorem's assumption, and `pytorch`, numformer's default). Here its small
configuration (6 + 6 layers, d_model 128, random tokens, two seeds); the full study (base's shape, random
tokens and real sentences, three seeds) is `python -m numformer.studies ln-placement`, and
`docs/studies.md` has its numbers."""),
    ("code", """\
from numformer.studies import ln_placement

study = ln_placement.run(Path(tempfile.mkdtemp()), ln_placement.SMALL, log=lambda line: None)
print(open(study["files"][1]).read())
display(Image(filename=study["files"][0]))"""),
    ("markdown", """\
Read the decoder rows: with Xavier initialisation post-LN's gradient rises toward the last layer and
pre-LN's does not (it falls gently), the paper's picture. With numformer's default initialisation the rise
is gone: its residual branches start small (the `branch` column, `std(F(x)) / std(x)`), so each post-LN
LayerNorm barely rescales the stream and the gradient no longer shrinks on its way down. The encoder's
post-LN gradient does not rise even with Xavier. A finding that depends on the initialisation is still a
finding: the theorem needs its assumptions."""),
]
CELLS[-1:-1] = LN_PLACEMENT_CELLS


def exercise_cells() -> list:
    """Section 6: check your own backward (numformer.finite_differences.check, the exercises' grading; docs/exercises.md).
    Seconds to run: float64 checks of small layers, no training."""
    return [
        ("markdown", """\
## 6. Check your own backward

`numformer.finite_differences.check(layer, *inputs)` runs the same finite-difference check on any object with the layer
contract (`forward`, `backward`, parameters whose `.grad` backward adds into), numformer's or yours. Here a layer
that is not in numformer, RMSNorm (Zhang and Sennrich 2019), written by hand, then the same layer with the path
through its normaliser forgotten."""),
        ("code", """\
from numformer.finite_differences import check
from numformer.module import Parameter

class RMSNorm:
    \"\"\"y = x / rms(x) * g, rms(x) = sqrt(mean(x^2) + eps) over the last axis.\"\"\"
    def __init__(self, d, eps=1e-6, forget_rms_path=False):
        self.g, self.eps, self.forget = Parameter(np.random.default_rng(1).standard_normal(d)), eps, forget_rms_path

    def forward(self, x):
        self.r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)
        self.xhat = x * self.r
        return self.xhat * self.g.data

    def backward(self, dy):
        self.g.grad += (dy * self.xhat).reshape(-1, dy.shape[-1]).sum(0)
        dxhat = dy * self.g.data
        if self.forget:
            return self.r * dxhat
        return self.r * (dxhat - self.xhat * (dxhat * self.xhat).mean(-1, keepdims=True))

x = np.random.default_rng(0).standard_normal((2, 5, 8))
print(check(RMSNorm(8), x))
wrong = check(RMSNorm(8, forget_rms_path=True), x)
print("\\nwith the path through rms(x) forgotten: passed =", wrong.passed,
      "; tensors off:", [(r.tensor, f"{r.max_rel_error:.2f}") for r in wrong.failed])"""),
        ("markdown", """\
The exercises (`python -m grad_checks exercise --list`) go further: each is a backward pass of the Transformer
to write, graded against finite differences *and* numformer's own backward on several inputs, and when the answer
is wrong the report names the classic mistake it matches. The same grading from Python: LayerNorm's backward with
its variance term forgotten, then right."""),
        ("code", """\
from grad_checks import exercises
from grad_checks.grading import grade

def layernorm_backward(dy, xhat, r, gamma):
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True))     # the variance's path forgotten
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)

result = grade(exercises.get("layernorm"), layernorm_backward)
print(result.summary())
print("why:", exercises.get("layernorm").explanation(result.exercise.mistake_names[result.mistake]))

def layernorm_backward(dy, xhat, r, gamma):
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)

print(grade(exercises.get("layernorm"), layernorm_backward).summary())"""),
        ("markdown", """\
`python -m grad_checks exercise layernorm` writes this exercise as a file to fill in, `python -m grad_checks check
my_layernorm.py` grades it, and `python3 train.py ... --swap LayerNorm=my_layernorm.py:LayerNorm` trains a
translator with it: docs/exercises.md walks through all of it."""),
    ]


_STUDY = CELLS.index(LN_PLACEMENT_CELLS[0])
CELLS = CELLS[:_STUDY] + exercise_cells() + CELLS[_STUDY:]  # section 6 before section 7 (the study)


def beyond_the_mean_cells() -> list:
    """Section 8: every sentence's gradient, the noise scale, and the curvature of one block
    (numformer/training/per_sentence_gradients.py, gradient_noise_scale.py, numformer/curvature/). Seconds: a tiny
    float64 model."""
    return [
        ("markdown", """\
## 8. Beyond the mean gradient: every sentence's gradient, the noise scale, the curvature of a block

numformer's backward sees each sentence's contribution to every parameter's gradient before the sum over the
batch, so `PerSentenceGradients` taps the layers and keeps, per tensor, every sentence's squared gradient norm
(and, if asked, the per-element sum of squares): exact, for every parameter, LayerNorm, the tied vocabulary matrix
(over its three uses) and cross-attention included. Sentence 0's gradient must then equal the gradient of a batch
holding sentence 0 alone (divided by the whole batch's token count):"""),
        ("code", """\
from numformer.kernels import kernel_mode
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.presets import ModelConfig
from numformer.training.gradient_noise_scale import noise_scales
from numformer.training.per_sentence_gradients import PerSentenceGradients

cfg = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32)
model = Transformer(cfg, seed=1, dtype=np.float64)
rng = np.random.default_rng(0)
src, tgt = rng.integers(1, 13, (32, 6)), rng.integers(1, 13, (32, 6))
src[1, 4:], tgt[2, 3:] = 0, 0                         # padding
crit = LabelSmoothedCrossEntropy(0.1, 0)
with kernel_mode("plain"), PerSentenceGradients(model) as tap:
    crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:])
    model.backward(crit.backward())
stats = tap.statistics()

n_tokens = int((tgt[:, 1:] != 0).sum())
model.zero_grad()
with kernel_mode("plain"):
    crit.forward(model(src[:1], tgt[:1, :-1]), tgt[:1, 1:], normalizer=n_tokens)   # sentence 0 alone
    model.backward(crit.backward())
tied = model.src_embed.weight
print("tied matrix, sentence 0: |g|^2 tapped", stats["src_embed.weight"].sq_norms[0], " alone", (tied.grad ** 2).sum())"""),
        ("markdown", """\
From those norms, McCandlish et al.'s gradient noise scale `B_simple = tr(Sigma) / |G|^2` (the batch size
beyond which larger batches stop paying) per layer type: `train.py --log-grads N` logs it during training, and
the study `noise-scale` follows it over a whole run (docs/studies.md)."""),
        ("code", """\
noise = noise_scales(stats)
for group, est in list(noise["groups"].items()) + [("total", noise["total"])]:
    print(f"{group:<13} B_simple {est.b_simple:8.2f} sentences   signal-to-noise {est.snr:6.2f}")"""),
        ("markdown", """\
(An estimate of `|G|^2` from one batch can come out negative where the noise dominates the signal; `B_simple` is
then undefined, `nan`. Training runs smooth both terms over the logged steps before dividing.)"""),
        ("markdown", """\
Curvature: every layer has forward mode beside its backward (`jvp`, the directional derivative of its forward,
and `backward_jvp`, its backward with the backward's own tangent), so `BlockHessian` gives `H v` for any block of
parameters exactly, by forward over reverse, with no step to choose. The central differences of numformer's own
gradients it used before stay as a cross-check (float64, the ReLU active sets held so that no kink is crossed,
with an estimate of their error). Lanczos gives the block's extreme eigenvalues; on a block this small they
equal those of its whole Hessian."""),
        ("code", """\
from numformer.curvature.hvp import BlockHessian
from numformer.curvature.lanczos import extreme_eigenvalues

names = ["encoder.layers.1.ffn_residual.norm.weight"]
block = BlockHessian(model, (src, tgt[:, :-1], tgt[:, 1:]), names)           # exact: forward over reverse
by_differences = BlockHessian(model, (src, tgt[:, :-1], tgt[:, 1:]), names, method="differences")
v = np.random.default_rng(1).standard_normal(block.dim)
hv = block(v)
print("|H v|", np.linalg.norm(hv), " differences of gradients differ by", np.linalg.norm(by_differences(v) - hv),
      " their stated error", by_differences.error(v))
exact = np.linalg.eigvalsh(block.dense())
top, low, _ = extreme_eigenvalues(block, block.dim, block.dim, np.random.default_rng(2))
print("eigh:    smallest", exact[0], " largest", exact[-1])
print("Lanczos: smallest", low, " largest", top[0])"""),
        ("markdown", """\
The study `hessian-blocks` uses the same tools for Zhang et al. 2024's blockwise spectra (stochastic Lanczos
quadrature of the query, key, value, output, feed-forward, LayerNorm and embedding blocks, at initialisation and
after training): `python -m numformer.studies hessian-blocks`, docs/studies.md."""),
    ]


CELLS[-1:-1] = beyond_the_mean_cells()


def build():
    import nbformat  # noqa: PLC0415

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source in CELLS:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):  # stable ids: rebuilding does not change them
        cell["id"] = f"cell-{i:02d}"
    return nb


def execute(nb, timeout: int = 600):
    """Run every cell in a fresh kernel started in docs/; returns the notebook with its outputs."""
    from nbclient import NotebookClient  # noqa: PLC0415

    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def sources(nb) -> list:
    return [(c.cell_type, c.source) for c in nb.cells]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare docs/study.ipynb's cells with CELLS")
    args = ap.parse_args(argv)
    import nbformat  # noqa: PLC0415

    if args.check:
        same = NOTEBOOK.is_file() and sources(nbformat.read(NOTEBOOK, as_version=4)) == sources(build())
        print("docs/study.ipynb matches its cells" if same else "docs/study.ipynb is out of date: rebuild it")
        return 0 if same else 1
    nb = execute(build())
    for cell in nb.cells:  # no run-specific noise in the committed file
        cell.metadata.pop("execution", None)
    nbformat.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
