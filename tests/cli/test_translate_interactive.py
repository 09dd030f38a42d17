"""translate.py at a terminal translates each line as it is typed; from a pipe it reads everything first.

The terminal is a pseudo-terminal (``os.openpty``): the test types a line, waits for its translation
to appear before typing the next one (so an implementation that waited for the end of input would
time out here), then ends with Ctrl-D. The translations must equal the piped (batched) run's, line
for line. The model is a small untrained one saved as a checkpoint with a tiny vocabulary.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numformer.checkpoint import save_checkpoint, vocab_fingerprint
from numformer.data.vocab import SubwordVocab
from numformer.model import Transformer
from numformer.presets import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
LINES = ["in the beginning", "and the earth was without form", "light"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    text = ["in the beginning god created the heaven and the earth", "and the earth was without form and void",
            "and god said let there be light and there was light"] * 20
    vocab = SubwordVocab.train(text, d / "spm", vocab_size=60)
    cfg = ModelConfig(vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=1, dropout=0.0, max_len=64)
    model = Transformer(cfg, seed=0)
    meta = {"model_config": cfg.to_dict(), "vocab_sha256": vocab_fingerprint(vocab), "step": 1}
    save_checkpoint(d / "checkpoints" / "step_0000001.npz", model.state_dict(), meta)
    return d


def _read_until(fd, n_lines: int, timeout: float) -> bytes:
    """Bytes from fd until ``n_lines`` newlines arrived (or the timeout, then what there is)."""
    data, end = b"", time.monotonic() + timeout
    while data.count(b"\n") < n_lines and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the pty closed
                break
            if not chunk:
                break
            data += chunk
    return data


def test_terminal_gets_each_translation_before_the_next_line_is_typed(run_dir):
    piped = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(run_dir), "--greedy"],
                           input="\n".join(LINES) + "\n", capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert piped.returncode == 0, piped.stderr
    expected = piped.stdout.splitlines()
    assert len(expected) == len(LINES)

    master, slave = os.openpty()
    out_r, out_w = os.pipe()  # translations on a pipe, so they are not mixed with the terminal's echo
    proc = subprocess.Popen([sys.executable, str(ROOT / "translate.py"), "--model", str(run_dir), "--greedy"],
                            stdin=slave, stdout=out_w, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    os.close(out_w)
    got = []
    try:
        for line in LINES:
            os.write(master, line.encode() + b"\n")
            answer = _read_until(out_r, 1, timeout=60)
            assert answer.endswith(b"\n"), f"no translation of {line!r} before the next line was typed"
            got.append(answer.decode().rstrip("\n"))
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(out_r)
    assert got == expected
    assert b"type a sentence" in proc.stderr.read()
    proc.stderr.close()
