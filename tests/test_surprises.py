"""No silent surprises: each test here failed on the behaviour it guards against.

* a bug in numformer (a ValueError or OSError nobody raised on purpose) is not a one-line "user error":
  it says it is a bug, writes its traceback to a file and names it, exit status 1;
* --vocab-size is never ignored without a word when OUT/spm.model exists;
* --resume with another --data folder is refused, as another preset is;
* the progress bar shows elapsed and remaining minutes of the budget;
* big averages the last 20 checkpoints (Section 6.1);
* EOS forced at the output length limit keeps the model's own log-probability (fairseq's rule);
* --log-grads is parsed with the project's checked type;
* a config the layers cannot be built from is refused up front, in one line.
"""
import errno
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
import translate  # noqa: E402
from numformer import cli_common  # noqa: E402
from numformer.data import SubwordVocab  # noqa: E402
from numformer.decode import beam_search, greedy_search, log_softmax  # noqa: E402
from numformer.errors import UsageError  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.prepare import prepare  # noqa: E402
from numformer.presets import ModelConfig, get_preset  # noqa: E402
from numformer.progress import budget_fraction, budget_text  # noqa: E402
from numformer.train_config import recipe  # noqa: E402
from numformer.trainer import Trainer  # noqa: E402
from test_robustness import run_main  # noqa: E402  (one in-process CLI runner for both files)




def one_line(err, prog, needle):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and "Traceback" not in err, err
    assert needle.lower() in lines[0].lower(), (needle, err)


def copy_args(out, steps=2, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "1", "--eval-every", "0", "--no-test", "--max-tokens", "300", "--average-last", "1",
            *extra]


# -- bugs are bugs --------------------------------------------------------------------------------------------
def test_user_errors_are_the_projects_own_classes():
    assert ValueError not in cli_common.USER_ERRORS and OSError not in cli_common.USER_ERRORS
    assert UsageError in cli_common.USER_ERRORS


def bug_report(err, prog):
    """The one line a bug prints -> the crash log it names (checked to hold the traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: internal error (a bug in numformer") and "please report it" in lines[0]
    log = Path(re.search(r"the traceback is in (\S+):", lines[0]).group(1))
    text = log.read_text()
    assert "Traceback (most recent call last)" in text
    return log, text


@pytest.mark.parametrize("exc", [ValueError("operands could not be broadcast together with shapes (3,) (4,)"),
                                 OSError(errno.EBADF, "Bad file descriptor")], ids=["ValueError", "OSError"])
def test_a_bug_in_translate_says_so_and_where_the_traceback_is(exc, tmp_path, monkeypatch, capsys):
    from test_robustness import make_random_run

    run = make_random_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("a b c\n")

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(translate, "translate_lines", broken)
    code, out, err = run_main(translate.main, ["--model", str(run), "--input", str(tmp_path / "in.txt")], capsys)
    assert code == 1 and out == ""
    log, text = bug_report(err, "translate.py")
    assert type(exc).__name__ in text and "in broken" in text
    log.unlink()


def test_a_bug_in_training_writes_run_crash_log(tmp_path, monkeypatch, capsys):
    def broken(self, *args, **kwargs):
        raise ValueError("shapes (2,3) and (4,5) not aligned")

    monkeypatch.setattr(Trainer, "train_step", broken)
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out), capsys)
    assert code == 1
    log, text = bug_report(err, "train.py")
    assert log == out / "crash.log" and "not aligned" in text


def test_a_full_disk_is_still_one_line(tmp_path, monkeypatch, capsys):
    from test_robustness import make_random_run

    run = make_random_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("a b c\n")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(translate, "translate_lines", full)
    code, out, err = run_main(translate.main, ["--model", str(run), "--input", str(tmp_path / "in.txt")], capsys)
    assert code == 2
    one_line(err, "translate.py", "no space left on device")


def test_an_impossible_config_is_refused_up_front():
    with pytest.raises(UsageError, match="d_model 128 is not divisible by heads 3"):
        get_preset("tiny", heads=3)
    with pytest.raises(UsageError, match="dropout must be in"):
        ModelConfig(dropout=1.5).validate()


# -- --vocab-size and an existing spm.model ----------------------------------------------------------------------
def test_vocab_size_is_not_ignored_when_an_earlier_attempt_left_spm_model(tmp_path, capsys):
    out = tmp_path / "run"
    prepare(out, task="copy", vocab_size=40)  # an earlier attempt that stopped after the vocabulary
    assert SubwordVocab.load(out / "spm.model").size == 40
    code, stdout, err = run_main(train.main, copy_args(out, 1, "--vocab-size", "50"), capsys)
    assert code == 0, err
    assert "has 40 pieces, --vocab-size asks for 50: retraining it" in stdout
    assert SubwordVocab.load(out / "spm.model").size == 50
    assert json.loads((out / "run.json").read_text())["model_config"]["vocab_size"] == 50


def test_vocab_size_of_a_resumed_run_cannot_change(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(train.main, copy_args(out, 1, "--vocab-size", "40"), capsys)[0] == 0
    code, _, err = run_main(train.main, ["--out", str(out), "--resume", "--max-steps", "2", "--no-progress",
                                         "--vocab-size", "50"], capsys)
    assert code == 2
    one_line(err, "train.py", "--vocab-size 50 differs from the run's vocabulary (40 pieces")
    code, stdout, err = run_main(train.main, ["--out", str(out), "--resume", "--max-steps", "2", "--no-progress",
                                              "--no-test", "--vocab-size", "40"], capsys)
    assert code == 0, err


# -- --resume with another --data folder -------------------------------------------------------------------------
def test_resume_with_another_data_folder_is_refused(tmp_path, capsys, monkeypatch):
    from test_robustness import write_corpus

    a = write_corpus(tmp_path / "a", {})
    b = write_corpus(tmp_path / "b", {})
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--vocab-size", "30", "--out", str(out), "--no-progress", "--eval-every", "0",
            "--no-test", "--save-every", "1", "--average-last", "1"]
    assert run_main(train.main, ["--data", str(a), "--max-steps", "1", *args], capsys)[0] == 0
    code, _, err = run_main(train.main, ["--data", str(b), "--max-steps", "2", "--resume", *args], capsys)
    assert code == 2
    one_line(err, "train.py", f"was trained on data {a.resolve()}, not data {b}")
    monkeypatch.chdir(tmp_path)  # the same folder, spelled another way (relative), is the same data
    code, _, err = run_main(train.main, ["--data", "a", "--max-steps", "2", "--resume", *args], capsys)
    assert code == 0, err


# -- the progress bar knows its budget -----------------------------------------------------------------------------
def test_budget_text_says_elapsed_and_left():
    assert budget_text(120, 300.0, None, 25) == "step 120 | 5.0 min elapsed, 20.0 min left (25 min budget)"
    assert budget_text(100, 60.0, 400, None, 0.5) == "step 100/400 | 1.0 min elapsed, ~2.5 min left (400 steps budget)"
    both = budget_text(100, 60.0, 400, 2, 0.5)  # the minutes end first: exact
    assert both == "step 100/400 | 1.0 min elapsed, 1.0 min left (2 min and 400 steps budget)"
    assert budget_fraction(100, 60.0, 400, 2) == 0.5 and budget_fraction(300, 0.0, 400, None) == 0.75


def test_progress_bar_of_a_minutes_budget_shows_minutes_left(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [a for a in copy_args(out, 1) if a != "--no-progress"]
    i = argv.index("--max-steps")
    argv[i:i + 2] = ["--max-minutes", "0.01"]
    code, _, err = run_main(train.main, argv, capsys)
    assert code == 0, err
    assert "min elapsed" in err and "min left (0.01 min budget)" in err, err


# -- Section 6.1: big averages 20 ---------------------------------------------------------------------------------
def test_big_averages_the_last_20_checkpoints():
    tcfg = recipe("big")
    assert tcfg.average_last == 20 and tcfg.keep_last >= 20
    assert recipe("base").average_last == 5


# -- EOS at the length limit ----------------------------------------------------------------------------------------
def teacher_forced_logprob(model, src_row, tokens, bos, eos):
    """sum of log P(token) over tokens + [EOS], by a full forward pass."""
    tgt = [bos] + list(tokens) + [eos]
    logits = np.asarray(model(np.asarray([src_row]), np.asarray([tgt[:-1]])))[0].astype(np.float64)
    logp = log_softmax(logits)
    return float(sum(logp[t, tok] for t, tok in enumerate(tgt[1:])))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_forced_eos_keeps_the_models_log_probability(search):
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1, dropout=0.0)
    model = Transformer(cfg, seed=3).eval()
    bos, eos = 2, 3
    src = np.random.default_rng(0).integers(4, 40, size=(6, 5))
    limit = 3  # max_len_a 0, max_len_b 3: at most two tokens and the (forced) EOS
    if search == "greedy":
        hyps = greedy_search(model, src, bos, eos, max_len_a=0.0, max_len_b=limit)
    else:
        hyps = [h[0] for h in beam_search(model, src, bos, eos, beam=2, alpha=0.0, max_len_a=0.0, max_len_b=limit)]
    forced = [i for i, h in enumerate(hyps) if len(h.tokens) == limit - 1]
    assert forced, "no hypothesis reached the limit: pick another seed"
    for i in forced:
        expected = teacher_forced_logprob(model, src[i], hyps[i].tokens, bos, eos)
        assert hyps[i].logprob == pytest.approx(expected, abs=1e-4)


# -- --log-grads -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, needle", [("-1", "must be at least 0, got -1"), ("x", "expected an integer")])
def test_log_grads_is_checked_when_parsed(value, needle, capsys):
    with pytest.raises(SystemExit) as done:
        train.parse_args(["--task", "copy", "--log-grads", value])
    assert done.value.code == 2
    one_line(capsys.readouterr().err, "train.py", needle)
