"""Train with your own backward (numformer.swap, train.py --swap): a student's layer class replaces numformer's
wherever the model builds that layer; with the reference solution in the student's file the swapped model has
the same parameters and trains bit for bit like numformer's (plain kernels); a bad --swap is one line, exit 2,
before any data is read; a swapped run's checkpoint loads into numformer."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import lab_files
from grad_checks import exercises
from numformer.activations import ACTIVATIONS
from numformer import loss as loss_module
from numformer.checkpoint.trained_model import load_model
from numformer.kernels import kernel_mode
from numformer.layers import LayerNorm
from numformer.layers.layernorm import layernorm_backward
from numformer.layers.registry import layer_class
from numformer.model import Transformer
from numformer.optim import Adam
from numformer.presets import ModelConfig
from numformer.swap import SwapError, load_class, swappable, swapped, unswapped, using

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from support import assert_one_line_error, copy_args, run_main  # noqa: E402

# every kind of layer present: pre-LN (final norms), attention and ReLU dropout, untied embeddings, learned
# positions (Table 3 row E: the LearnedPositionalEmbedding exercise's layer; PositionalEncoding has no exercise)
CFG = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.1, attn_dropout=0.1,
                  relu_dropout=0.1, pre_norm=True, max_len=32, positional="learned")
SWAPPED = [e.name for e in exercises.all_exercises() if e.swap]


def _batches(n=3):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        src, tgt = rng.integers(4, 13, size=(3, 6)), rng.integers(4, 13, size=(3, 6))
        src[1, 4:], tgt[2, 3:] = 0, 0  # padding
        out.append((src, tgt))
    return out


def _train(model, crit, batches):
    """A few Adam steps; the losses and the final weights."""
    opt = Adam(model.parameters(), lr=1e-2)
    losses = []
    for src, tgt in batches:
        losses.append(float(crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:])))
        model.backward(crit.backward())
        opt.step(zero_grad=True)
    return losses, model.state_dict()


def _reference_file(name, tmp_path):
    """The student's file with numformer's own solution written in, and its layer class loaded as --swap does."""
    ex = exercises.get(name)
    return ex, load_class(lab_files.write(ex, ex.target, tmp_path), ex.layer.__name__, ex.swap)


@pytest.mark.parametrize("name", SWAPPED)
def test_a_swapped_layer_reaches_every_use_and_trains_bit_for_bit(name, tmp_path):
    ex, cls = _reference_file(name, tmp_path)
    # the feed-forward builds one activation: the table's whose layer is swapped
    cfg = next((CFG.replace(activation=row.name) for row in ACTIVATIONS.values() if row.layer == ex.swap), CFG)
    with kernel_mode("plain"):
        ref_model = Transformer(cfg, seed=3)
        ref_losses, ref_state = _train(ref_model, loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
        with swapped({ex.swap: cls}):
            model = Transformer(cfg, seed=3)
            crit = layer_class("LabelSmoothedCrossEntropy")(0.1, 0)  # as the trainer builds it
        assert layer_class(ex.swap) is swappable()[ex.swap]  # restored after the block
        mine = [m for m in list(model.modules()) + [crit] if isinstance(m, cls)]
        theirs = [m for m in list(ref_model.modules()) + [loss_module.LabelSmoothedCrossEntropy(0.1, 0)]
                  if type(m) is ex.layer]
        assert len(mine) == len(theirs) >= 1  # every use swapped
        assert not [m for m in model.modules() if type(m) is ex.layer]
        assert list(model.state_dict()) == list(ref_model.state_dict())  # checkpoints stay portable
        losses, state = _train(model, crit, _batches())
    assert losses == ref_losses
    assert all(np.array_equal(state[k], ref_state[k]) for k in ref_state)


def test_with_fast_kernels_a_swapped_layernorm_trains_to_the_same_loss(tmp_path):
    _, cls = _reference_file("layernorm", tmp_path)
    ref_losses, _ = _train(Transformer(CFG, seed=3), loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
    with swapped(LayerNorm=cls):
        model = Transformer(CFG, seed=3)
    losses, _ = _train(model, loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


def test_a_wrong_swapped_layer_changes_training(tmp_path):
    """The parity above is not vacuous: the catalogued mistake swapped in gives other losses."""
    ex = exercises.get("layernorm")
    cls = load_class(lab_files.write(ex, ex.mistakes[0], tmp_path), "LayerNorm")
    ref_losses, _ = _train(Transformer(CFG, seed=3), loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
    with swapped(LayerNorm=cls):
        model = Transformer(CFG, seed=3)
    losses, _ = _train(model, loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
    assert losses[0] == ref_losses[0] and losses[1:] != ref_losses[1:]  # same forward, other gradients


def test_using_rebinds_numformers_methods_to_the_given_function():
    calls = []

    def mine(dy, xhat, r, gamma):
        calls.append(dy.shape)
        return layernorm_backward(dy, xhat, r, gamma)

    cls = using(LayerNorm, layernorm_backward=mine)
    assert issubclass(cls, LayerNorm) and cls.__name__ == "LayerNorm"
    ln = cls(4)
    ln.backward(np.ones((2, 3, 4), np.float32)) if ln.forward(np.ones((2, 3, 4), np.float32)) is not None else None
    assert calls == [(6, 4)]
    with pytest.raises(ValueError, match="no function 'nope'"):
        using(LayerNorm, nope=mine)
    with pytest.raises(ValueError, match="no method of LayerNorm calls get_array_module"):
        using(LayerNorm, get_array_module=mine)


def test_unswapped_gives_numformers_classes_back_inside_a_block(tmp_path):
    _, cls = _reference_file("layernorm", tmp_path)
    with swapped(LayerNorm=cls):
        assert layer_class("LayerNorm") is cls
        with unswapped():
            assert layer_class("LayerNorm") is LayerNorm
        assert layer_class("LayerNorm") is cls
    assert layer_class("LayerNorm") is LayerNorm
    with pytest.raises(SwapError, match="unknown layer 'Conv2d'"):
        with swapped(Conv2d=cls):
            pass


def _spec_file(tmp_path, text):
    path = tmp_path / "mine.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("spec, needle", [
    ("LayerNorm", "write LAYER=FILE.py:CLASS"),
    ("LayerNorm={dir}/missing.py:LayerNorm", "missing.py: no such file"),
    ("LayerNorm={file}:Nope", "has no class 'Nope' (it defines Plain, Added)"),
    ("Conv2d={file}:Plain", "unknown layer 'Conv2d'"),
    ("LayerNorm={file}:Plain", "has no backward method"),
    ("LayerNorm={dir}/my_layernorm.py:LayerNorm", "is not written yet"),
    ("LayerNorm={file}:Added", "checkpoints would not load"),
])
def test_a_bad_swap_is_one_line_exit_2(spec, needle, tmp_path, capsys):
    from grad_checks.lab import write_exercise

    write_exercise("layernorm", str(tmp_path))
    path = _spec_file(tmp_path, "from numformer.layers import LayerNorm\nfrom numformer.module import Parameter\n"
                                "import numpy as np\n"
                                "class Plain:\n    def forward(self, x):\n        return x\n"
                                "class Added(LayerNorm):\n    def __init__(self, *a, **k):\n"
                                "        super().__init__(*a, **k)\n        self.extra = Parameter(np.zeros(2))\n")
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out, 2, "--swap", spec.format(dir=tmp_path, file=path)), capsys)
    assert_one_line_error(code, err, "train.py", needle)
    if "checkpoints" not in needle:
        assert not out.exists()  # refused before the run folder or the data were touched


def test_train_py_swap_trains_like_numformer_and_its_checkpoint_loads(tmp_path, capsys):
    ex, _ = _reference_file("layernorm", tmp_path)
    spec = f"LayerNorm={tmp_path / 'my_layernorm.py'}:LayerNorm"
    with kernel_mode("plain"):
        assert train.main(copy_args(tmp_path / "plain", 4)) == 0
        assert train.main(copy_args(tmp_path / "swap", 4, "--swap", spec)) == 0
    out = capsys.readouterr().out
    assert "swap: LayerNorm <- " in out and "its backward grades EXACT" in out

    def losses(run):
        return [json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
                if "train_loss" in line]
    assert losses(tmp_path / "swap") == losses(tmp_path / "plain") and len(losses(tmp_path / "plain")) == 4
    assert json.loads((tmp_path / "swap" / "run.json").read_text())["swap"] == [spec]
    model, _, _ = load_model(tmp_path / "swap")  # numformer's own classes load the swapped run's weights
    assert type(model.encoder.layers[0].ffn_residual.norm) is LayerNorm


def test_a_swapped_layer_that_raises_while_training_is_one_line(tmp_path, capsys):
    path = _spec_file(tmp_path, "from numformer.layers import LayerNorm as Base\n"
                                "class LayerNorm(Base):\n    def backward(self, dy):\n"
                                "        raise RuntimeError('my bug')\n")
    code, out, err = run_main(train.main, copy_args(tmp_path / "run", 2, "--swap", f"LayerNorm={path}:LayerNorm"),
                              capsys)
    assert "WARNING: its backward grades ERROR" in out  # graded first: trained anyway, as asked
    assert_one_line_error(code, err, "train.py", "your LayerNorm.backward from")
    assert "RuntimeError at mine.py:4 in backward: my bug" in err


def test_a_swapped_file_whose_own_code_never_returns_is_stopped_in_one_line(tmp_path, capsys, monkeypatch):
    from numformer import user_code_clock

    monkeypatch.setattr(user_code_clock, "DEFAULT_TIME_LIMIT", 1.0)
    path = _spec_file(tmp_path, "import time\nwhile True:\n    time.sleep(0.01)\n")
    code, _, err = run_main(train.main, copy_args(tmp_path / "run", 2, "--swap", f"LayerNorm={path}:LayerNorm"),
                            capsys)
    assert_one_line_error(code, err, "train.py", f"importing {path.name} did not return within 1 s: stopped at "
                                                 f"{path}:3")
    assert f"check it with python -m grad_checks check {path}" in err
    assert not (tmp_path / "run").exists()
