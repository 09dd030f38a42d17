"""The table of model flags (numformer/training/model_flags.py): every row is a flag of train.py, sets its
ModelConfig field in a new run, is kept by a resumed run unless given again, and (an architecture row) is
refused next to --init-from; adding a flag is one row, shown by --activation, which is only that row."""
import dataclasses

import pytest

import train
from numformer.presets import ModelConfig
from numformer.training.config import RESUMED_MODEL_FIELDS, VALUE_FLAGS, settle
from numformer.training.model_flags import MODEL_FLAGS, TRAINING_ONLY
from support import assert_one_line_error, run_main

#: the value each value flag is tried with: written here for a number; a flag of choices (--positional,
#: --activation, ...) takes its first choice other than the default, so a new one needs no line here
VALUES = {"--dropout": "0.25", "--label-smoothing": "0.05"}
VALUES.update({f.flag: next(c for c in f.parser["choices"] if c != getattr(ModelConfig(), f.field))
               for f in MODEL_FLAGS if "choices" in f.parser})


def _typed(f):
    return [f.flag] if f.is_switch else [f.flag, VALUES[f.flag]]


def _wanted(f):
    value = f.switch_value if f.is_switch else VALUES[f.flag]
    return float(value) if f.field in ("dropout", "label_smoothing") else value


def test_every_row_is_a_flag_on_a_model_config_field_with_a_value_to_test():
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert all(f.field in fields for f in MODEL_FLAGS)
    assert {f.flag for f in MODEL_FLAGS if not f.is_switch} == set(VALUES)  # a new value flag gets a test value here
    assert RESUMED_MODEL_FIELDS == tuple(f.field for f in MODEL_FLAGS)
    assert set(VALUE_FLAGS.values()) == set(VALUES) and set(TRAINING_ONLY) == {"dropout", "label_smoothing"}


@pytest.mark.parametrize("f", MODEL_FLAGS, ids=[f.flag for f in MODEL_FLAGS])
def test_each_flag_sets_its_field_and_a_resumed_run_keeps_it(f):
    flags = vars(train.parse_args(["--task", "copy", "--preset", "tiny", *_typed(f)]))
    run = settle(flags, "cpu", None, "runs/x")
    assert run.model[f.field] == _wanted(f)
    # resumed without the flag: the run.json's value is kept
    saved = {"preset": "tiny", "data": "task:copy", "source": run.source,
             "model_config": dataclasses.asdict(ModelConfig().replace(**run.model)),
             "train_config": dataclasses.asdict(run.train)}
    again = settle(vars(train.parse_args(["--out", "runs/x", "--resume"])), "cpu", saved, "runs/x")
    assert again.model[f.field] == _wanted(f)


@pytest.mark.parametrize("f", [f for f in MODEL_FLAGS if f.architecture], ids=lambda f: f.flag)
def test_an_architecture_flag_is_refused_with_init_from(f, capsys, tmp_path):
    code, _, err = run_main(train.main, ["--init-from", str(tmp_path / "model.npz"), "--task", "copy", *_typed(f)],
                            capsys)
    assert_one_line_error(code, err, "train.py", f"leave out {f.flag}")


def test_activation_trains_the_model_it_names(capsys, tmp_path):
    from numformer.checkpoint import load_checkpoint
    out = tmp_path / "run"
    code, _, err = run_main(train.main, ["--task", "copy", "--preset", "tiny", "--activation", "gelu_tanh",
                                         "--max-steps", "2", "--out", str(out), "--no-progress", "--save-every",
                                         "2", "--eval-every", "0", "--no-test", "--max-tokens", "300"], capsys)
    assert code == 0, err
    ckpt = load_checkpoint(out / "checkpoints" / "step_0000002.npz")
    assert ckpt.meta["model_config"]["activation"] == "gelu_tanh"
