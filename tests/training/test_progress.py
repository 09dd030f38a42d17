"""The progress bar knows its budget: elapsed and remaining minutes of --max-minutes, or of --max-steps
estimated from the speed (numformer/training/progress_bar.py)."""
from support import copy_args, run_main

import train  # noqa: E402
from numformer.training.progress_bar import budget_fraction, budget_text


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
