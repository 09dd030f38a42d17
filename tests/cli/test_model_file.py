"""A trained model is one file: checkpoints and averages carry their vocabulary and config, translate.py
runs on a file copied alone to a fresh folder, older files without the vocabulary still load with --vocab,
`python -m numformer.checkpoint export` writes .npz or .safetensors (loaded back by translate.py and
grad_checks, and by PyTorch through safetensors.torch into the test mirror with the same logits), and a
stale RUN/averaged.npz never shadows newer checkpoints."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from numformer import checkpoint as checkpoint_module  # noqa: E402
from numformer.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from numformer.checkpoint_command import main as checkpoint_command  # noqa: E402
from numformer.checkpoint.run_model_file import newest_model_file  # noqa: E402
from numformer.checkpoint.trained_model import load_model  # noqa: E402
from numformer.decoding.search import log_softmax  # noqa: E402
from numformer.presets import ModelConfig  # noqa: E402

SOURCES = "a b c d\nq w e r t y\nz\n"


def copy_args(out, steps, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "3", "--eval-every", "0", "--no-test", "--log-every", "3", "--max-tokens", "400",
            "--average-last", "2", *extra]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny copy-task run of 6 steps: checkpoints at 3 and 6, averaged.npz of the two (by the average
    command: train.py keeps an average only when it validates better, and 6 steps are too few), spm.model."""
    out = tmp_path_factory.mktemp("modelfile") / "run"
    assert train.main(copy_args(out, 6)) == 0
    assert checkpoint_command(["average", "--last", "2", str(out), "--out", str(out / "averaged.npz")]) == 0
    return out


def translate(model, cwd, *extra):
    """translate.py in a subprocess started in ``cwd``: (status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(model), "--greedy", *extra],
                          input=SOURCES, capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_checkpoints_and_the_average_carry_the_vocabulary(run):
    spm = (run / "spm.model").read_bytes()
    for path in [run / "averaged.npz", *sorted((run / "checkpoints").glob("step_*.npz"))]:
        ck = load_checkpoint(path)
        assert ck.vocab == spm, path
        assert ModelConfig.from_dict(ck.meta["model_config"]).vocab_size == ck.meta["vocab_size"]


def test_a_model_file_copied_alone_translates(run, tmp_path):
    code, expected, err = translate(run, tmp_path)
    assert code == 0, err
    alone = tmp_path / "fresh"
    alone.mkdir()
    shutil.copy(run / "averaged.npz", alone / "model.npz")
    code, out, err = translate("model.npz", alone)
    assert code == 0, err
    assert out == expected and len(out.splitlines()) == 3
    assert sorted(p.name for p in alone.iterdir()) == ["model.npz"]  # nothing else was needed or written


def test_an_old_checkpoint_without_the_vocabulary_loads_with_vocab(run, tmp_path):
    ck = load_checkpoint(run / "averaged.npz")
    old = tmp_path / "old.npz"
    save_checkpoint(old, ck.model, ck.meta)  # the layout before vocabularies were embedded
    assert load_checkpoint(old).vocab is None
    code, out, err = translate(old, tmp_path)
    assert code == 2 and "pass --vocab" in err and "Traceback" not in err
    code, out, err = translate(old, tmp_path, "--vocab", str(run / "spm.model"))
    assert code == 0, err
    assert out == translate(run, tmp_path)[1]


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "model.safetensors"
    assert checkpoint_command(["export", str(run), "--format", "safetensors", "--out", str(out)]) == 0
    return out


def test_safetensors_round_trip(run, exported, tmp_path):
    from safetensors.numpy import load_file

    src, back = load_checkpoint(run / "averaged.npz"), load_checkpoint(exported)
    assert back.optimizer is None and back.vocab == (run / "spm.model").read_bytes()
    assert back.meta["model_config"] == src.meta["model_config"]
    assert sorted(back.model) == sorted(src.model)
    for name in src.model:
        assert back.model[name].dtype == src.model[name].dtype and np.array_equal(back.model[name], src.model[name])
    assert sorted(load_file(str(exported))) == sorted(src.model)  # a plain safetensors reader sees the weights only
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(exported, alone / "m.safetensors")
    code, out, err = translate("m.safetensors", alone)
    assert code == 0, err
    assert out == translate(run, tmp_path)[1]


def test_npz_export_is_a_model_without_training_state(run, tmp_path):
    out = tmp_path / "model.npz"
    assert checkpoint_command(["export", str(run / "checkpoints" / "step_0000006.npz"), "--out", str(out)]) == 0
    ck = load_checkpoint(out)
    assert ck.optimizer is None and ck.vocab is not None and "rng" not in ck.meta
    assert out.stat().st_size < (run / "checkpoints" / "step_0000006.npz").stat().st_size / 2  # no Adam moments


def test_grad_checks_run_on_an_exported_safetensors_model(exported, capsys):
    from grad_checks.__main__ import main as grad_checks_main

    assert grad_checks_main(["--checkpoint", str(exported), "--layer", "LayerNorm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checks"] > 0 and report["failed"] == 0 and report["layers"] == ["LayerNorm"]


def test_pytorch_loads_the_safetensors_file_into_the_mirror_with_the_same_logits(exported):
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from safetensors.torch import load_file

    from reference import torch_mirror as tm

    tensors = load_file(str(exported))  # torch tensors: what a PyTorch user gets
    with safe_open(str(exported), framework="pt") as f:
        metadata = f.metadata()
    cfg = ModelConfig.from_dict(json.loads(metadata["model_config"]))
    linear = json.loads(metadata["linear_weights"])
    assert linear and all(tensors[n].ndim == 2 for n in linear)
    P = tm.MirrorParams([(n, t.numpy()) for n, t in tensors.items()], linear)

    model, vocab, _ = load_model(exported)
    rng = np.random.default_rng(0)
    src = rng.integers(4, cfg.vocab_size, size=(2, 7))
    src[1, 5:] = cfg.pad_id
    tgt_in = rng.integers(4, cfg.vocab_size, size=(2, 5))
    tgt_in[:, 0] = vocab.bos_id
    ours = np.asarray(model(src, tgt_in), dtype=np.float64)
    theirs = tm.transformer(P, torch.from_numpy(src), torch.from_numpy(tgt_in), tm.Arch.from_config(cfg))
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape == (2, 5, cfg.vocab_size)
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-5  # numformer float32 vs torch float64
    np.testing.assert_allclose(log_softmax(ours), log_softmax(theirs), atol=1e-4)
    # The same predictions: numformer's pick at each position is torch's best up to the float32 error
    # allowed above (two tokens closer than that are a tie that rounding may break either way).
    picked = np.take_along_axis(log_softmax(theirs), ours.argmax(-1)[..., None], axis=-1)[..., 0]
    assert np.all(picked >= log_softmax(theirs).max(-1) - 2e-4)


def test_a_damaged_safetensors_file_is_one_line(exported, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(exported.read_bytes()[:200])
    code, out, err = translate(bad, tmp_path)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()] and "truncated or corrupt" in err


# -- a stale average -------------------------------------------------------------------------------------------
def test_a_stale_average_never_shadows_newer_checkpoints(run, tmp_path, monkeypatch, capsys):
    """--resume trains on past the average an earlier attempt left (here --average-last 1 writes no new
    one): translate.py and grad_checks --checkpoint must use the newest checkpoint, not the old average."""
    r = Path(shutil.copytree(run, tmp_path / "run"))
    assert train.main(copy_args(r, 9, "--resume", "--average-last", "1")) == 0
    newest = r / "checkpoints" / "step_0000009.npz"
    assert load_checkpoint(r / "averaged.npz").meta["step"] == 6  # the earlier attempt's average is still there
    assert newest_model_file(r) == newest
    code, out, err = translate(r, tmp_path)
    assert code == 0 and f"with {newest}" in err, err

    loaded = []
    real = checkpoint_module.load_checkpoint
    monkeypatch.setattr(checkpoint_module, "load_checkpoint", lambda p, **k: loaded.append(Path(p)) or real(p, **k))
    from grad_checks.__main__ import main as grad_checks_main

    capsys.readouterr()
    assert grad_checks_main(["--checkpoint", str(r), "--layer", "LayerNorm", "--json"]) == 0
    assert loaded == [newest]


def test_a_fresh_average_is_preferred(run):
    assert newest_model_file(run) == run / "averaged.npz"
