"""bench/torch_trainer.py, the PyTorch side of bench/budget_race.py: the same model (weights carried both ways, the
same logits), the same training (from the same start, on the same batches, the same losses and weights after a few
steps), the same flow around it (checkpoints numformer reads, the test translation), and one-line refusals."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from numformer.checkpoint import load_checkpoint
from numformer.data import make_synthetic
from numformer.model import Transformer
from numformer.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import torch_trainer  # noqa: E402

STEPS = 6


def tiny_cfg(**kw):
    return get_preset("tiny", vocab_size=61, pad_id=0, **kw)


def test_weights_go_to_pytorch_and_back_unchanged():
    cfg = tiny_cfg()
    state = Transformer(cfg, seed=3).state_dict()
    back = torch_trainer.torch_to_numformer(cfg, torch_trainer.numformer_to_torch(cfg, state))
    assert set(back) == set(state)
    for name, a in state.items():
        np.testing.assert_array_equal(back[name], a, err_msg=name)


def test_the_pytorch_model_computes_numformers_logits_with_padding():
    """float64, dropout off, a padded source and target: the same logits to the rounding of the PyTorch model's
    positional table, which torch_reference.py keeps in float32 (4e-8 measured; a weight in the wrong place moves
    logits by O(1))."""
    cfg = tiny_cfg(dropout=0.0)
    model = Transformer(cfg, seed=4, dtype=np.float64)
    model.eval()
    ref = torch_trainer.torch_model_for(cfg).double().eval()
    torch_trainer.load_into_torch(ref, cfg, model.state_dict())
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, cfg.vocab_size, (3, 9)), rng.integers(3, cfg.vocab_size, (3, 7))
    src[1, 5:], tgt[1, 4:], tgt[:, 0] = 0, 0, 1  # padding on both sides; BOS first
    ours = model(src, tgt)
    with torch.no_grad():
        theirs = ref(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    keep = tgt != 0  # a padded query row's logits are not defined alike (its softmax runs over masked keys)
    np.testing.assert_allclose(ours[keep], theirs[keep], rtol=0, atol=1e-6)


def run(cmd, out, *flags):
    return subprocess.run([sys.executable, str(ROOT / cmd), "--task", "reverse", "--preset", "tiny", "--max-steps",
                           str(STEPS), "--dropout", "0", "--log-every", "1", "--eval-every", "0", "--no-progress",
                           "--max-tokens", "400", "--out", str(out), *flags], capture_output=True, text=True, timeout=600)


def losses(folder):
    return [r["train_loss"] for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if "train_loss" in r]


def test_pytorch_trains_as_numformer_does_and_leaves_a_run_numformer_reads(tmp_path):
    """Dropout off, the same seed: the same batches, the same Eq. 3 rates and Adam give the same losses step by step
    and nearly the same weights after STEPS steps (float32 in two libraries: the rounding differs); the PyTorch
    run's checkpoint is a numformer checkpoint, and its test translation was written."""
    ours, theirs = tmp_path / "numformer", tmp_path / "torch"
    a = run("train.py", ours, "--no-test")
    b = run("bench/torch_trainer.py", theirs)
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert "scaled_dot_product_attention" in b.stdout
    la, lb = losses(ours), losses(theirs)
    assert len(la) == len(lb) == STEPS
    np.testing.assert_allclose(lb, la, rtol=2e-4)
    wa = load_checkpoint(sorted(ours.glob("checkpoints/step_*.npz"))[-1], with_optimizer=False).model
    wb = load_checkpoint(sorted(theirs.glob("checkpoints/step_*.npz"))[-1], with_optimizer=False).model
    for name in wa:
        np.testing.assert_allclose(wb[name], wa[name], rtol=0, atol=2e-4, err_msg=name)
    scores = json.loads((theirs / "test_scores.json").read_text())
    assert scores["steps"] == STEPS and scores["sentences"] == 500


def test_the_pytorch_run_tests_the_model_its_folder_holds(tmp_path):
    """Checkpoints at steps 2, 4 and 6: the run's test translation is the one translate.py gives from its folder (the
    average of the checkpoints, or the last one when the average was worse on validation), not from the weights
    PyTorch ended with (a copy of them after averaging would test the last step under the average's name)."""
    theirs = tmp_path / "torch"
    res = run("bench/torch_trainer.py", theirs, "--save-every", "2", "--keep-last", "3", "--average-last", "3")
    assert res.returncode == 0, res.stderr
    assert (theirs / "averaged.npz").exists() == ("testing the last checkpoint" not in res.stdout)
    test_src = make_synthetic("reverse", 20000, 500, 500, seed=1)["test"][0]  # the corpus train.py builds (seed 1)
    (tmp_path / "test.src").write_text("\n".join(test_src) + "\n")
    again = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(theirs), "--input",
                            str(tmp_path / "test.src")], capture_output=True, text=True, timeout=300, check=True)
    assert again.stdout.splitlines() == (theirs / "test.hyp").read_text().splitlines()
