"""translate.py's contract on any text: one output line per input line, in order, for any Unicode; an output
never holds a line break or a tab; long lines are translated whole up to the positional table and split
at word boundaries beyond it."""
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import translate
from numformer.decoding import translation
from numformer.checkpoint.trained_model import load_model
from numformer.data import normalize_line
from numformer.decoding.search import Hypothesis
from numformer.decoding.translation import DecodeOptions, split_long, translate_lines
from support import ROOT


SPECIAL_LINES = [
    "", " ", "\t \t", "\r", "\x0b", "\x0c", "\x1c", "\x1d\x1e\x1f", "\x85", "\u2028", "\u2029", "a\u2028b",
    "x\x0cy\x0bz", "\x00", "\x07\x1b[31mred\x1b[0m", "😀🎉👍🏽", "👨‍👩‍👧‍👦 family",
    "Привет мир", "你好，世界", "مرحبا بالعالم", "mixed: English, español, Ελληνικά, 日本語, עברית 😀",
    "\ufeffbom inside", "\u200b\u200d",
    "tab\tseparated\tcells", "▁▁already▁pieces", "<s> </s> <pad> <unk>", "a" * 400,
    " ".join(["word"] * 150), "😀" * 60, "\ud7ff\ue000\uffff\U0010ffff",
]


line_text = st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=80)


lines_strategy = st.lists(st.one_of(line_text, st.sampled_from(SPECIAL_LINES)), min_size=0, max_size=8)


def identity_search(model, src, bos_id, eos_id, *args, **kwargs):
    """A stand-in for greedy search that copies the source: makes the plumbing's order checkable."""
    assert src.shape[1] <= model.cfg.max_len  # the encoder never sees more than its table
    out = []
    for row in np.asarray(src):
        ids = [int(t) for t in row if t != model.cfg.pad_id]
        assert ids[-1] == eos_id
        out.append(Hypothesis(ids[:-1], 0.0, 0.0))
    return out


@pytest.fixture(scope="module")
def random_model(random_run):
    return load_model(random_run)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=lines_strategy)
def test_translate_lines_keeps_order_and_splits_long_lines(lines, random_model, monkeypatch):
    """With a copying search, line i's output is exactly the round trip of line i: nothing is lost,
    reordered or merged, lines longer than the positional table (31 tokens here) come back whole."""
    monkeypatch.setattr(translation, "greedy_search", identity_search)
    model, vocab, _ = random_model
    hyps = translate_lines(model, vocab, lines, DecodeOptions(beam=1, max_tokens=64))
    assert len(hyps) == len(lines)
    for line, hyp in zip(lines, hyps):
        clean = normalize_line(line)
        expected = normalize_line(vocab.decode(vocab.encode([clean]))[0]) if clean else ""
        assert hyp == expected
        assert not any(c in hyp for c in "\n\r\t\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=lines_strategy, beam=st.sampled_from([1, 2]))
def test_translate_cli_gives_one_line_per_input_line(lines, beam, random_run, tmp_path_factory):
    """translate.py with a random-weight model (it emits byte pieces such as <0x0A> at random): exactly one
    output line per input line, blank for blank, none containing a line break."""
    folder = tmp_path_factory.mktemp("cli")
    src, out = folder / "in.txt", folder / "out.txt"
    src.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    code = translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out), "--beam", str(beam),
                           "--max-len-b", "4", "--max-tokens", "200"])
    assert code == 0
    data = out.read_bytes().decode("utf-8")
    assert data.count("\n") == len(lines) and (data == "" or data.endswith("\n"))
    hyps = data.split("\n")[:-1]
    for line, hyp in zip(lines, hyps):
        if normalize_line(line) == "":
            assert hyp == "", (line, hyp)
        assert hyp == normalize_line(hyp)  # no tabs, no line separators, no runs of whitespace
        assert not any(c in hyp for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    assert not list(folder.glob(".*numformer-partial-*"))  # the atomic output left no temporary file


def test_translate_stdin_end_to_end(random_run):
    lines = ["Hello world.", "", "  ", "a\x0cb\x0bc\x1cd\x85e\u2028f\u2029g", "😀 emoji", "tab\there",
             "Привет 你好 مرحبا", "x" * 3000, "\x00\x07", "crlf"]
    data = "\n".join(lines[:-1]).encode("utf-8") + b"\n" + b"crlf\r\n"
    out = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(random_run), "--nbest", "2",
                          "--beam", "2", "--max-len-b", "3"], input=data, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("utf-8")
    rows = text.split("\n")
    assert rows[-1] == "" and len(rows) - 1 == len(lines)
    for line, row in zip(lines, rows):
        cells = row.split("\t")
        assert len(cells) == 2  # --nbest 2: two tab-separated candidates
        if not normalize_line(line):
            assert cells == ["", ""]
    assert out.stderr.decode().count("\n") == 1 and "translated 10 lines" in out.stderr.decode()


def test_empty_input_gives_empty_output(random_run, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"")
    assert translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out)]) == 0
    assert out.read_bytes() == b""
    src.write_bytes(b"\n\n\n")
    assert translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out)]) == 0
    assert out.read_bytes() == b"\n\n\n"


def test_byte_pieces_cannot_break_lines(random_model, monkeypatch):
    """A vocabulary with byte fallback can decode to '\\n' or '\\t': outputs are cleaned like inputs."""
    model, vocab, _ = random_model
    bad = [vocab.piece_to_id(p) for p in ("<0x0A>", "<0x09>", "<0x0D>", "<0x0B>")]

    def search(model, src, bos_id, eos_id, *a, **k):
        return [Hypothesis(bad + [vocab.piece_to_id("▁the")] + bad, 0.0, 0.0) for _ in range(src.shape[0])]

    monkeypatch.setattr(translation, "greedy_search", search)
    assert translate_lines(model, vocab, ["one", "", "two"], DecodeOptions(beam=1)) == ["the", "", "the"]


def test_split_long_cuts_at_word_starts_within_the_limit():
    word_start = np.array([False, True, False, False])  # id 1 starts a word, ids 2 and 3 continue one
    ids = [1, 2, 2, 1, 3, 1, 2, 2, 2, 1]
    assert split_long(ids, 10, word_start) == [ids]
    pieces = split_long(ids, 4, word_start)
    assert pieces == [[1, 2, 2], [1, 3], [1, 2, 2, 2], [1]]
    assert all(len(p) <= 4 for p in pieces) and sum(pieces, []) == ids
    assert split_long([2] * 9, 4, word_start) == [[2] * 4, [2] * 4, [2]]  # one long word: cut at the limit
    assert split_long([2] * 9, 4) == [[2] * 4, [2] * 4, [2]]


def test_lines_up_to_the_table_are_translated_whole(random_model, monkeypatch):
    model, vocab, _ = random_model
    seen = []

    def search(model, src, bos_id, eos_id, *a, **k):
        seen.extend(int((row != 0).sum()) for row in np.asarray(src))
        return identity_search(model, src, bos_id, eos_id)

    monkeypatch.setattr(translation, "greedy_search", search)
    limit = model.cfg.max_len - 1
    extra = len(vocab.encode(["x"])[0]) - 1  # 'x' is not in the vocabulary: one byte piece per x, and a '▁'
    for n in (limit, limit + 1, 3 * limit + 5):
        seen.clear()
        line = "x" * (n - extra)
        assert len(vocab.encode([line])[0]) == n
        out = translate_lines(model, vocab, [line], DecodeOptions(beam=1))
        assert out == [line]
        if n <= limit:
            assert seen == [n + 1]  # one piece, with its EOS: nothing cut
        else:
            assert len(seen) == -(-n // limit) and max(seen) <= model.cfg.max_len


def test_output_length_never_exceeds_the_positional_table(random_model, monkeypatch):
    """A budget a*n+b beyond the table is capped (it used to raise deep inside the decoder): every
    hypothesis has at most max_len - 1 tokens before its EOS (the EOS takes the last position), and the
    random model, which rarely ends on its own, reaches exactly that cap."""
    model, vocab, _ = random_model
    lengths = []

    def recording(search, nested):
        def run(*args, **kwargs):
            result = search(*args, **kwargs)
            lengths.extend(len(h.tokens) for hyps in result for h in (hyps if nested else [hyps]))
            return result
        return run

    monkeypatch.setattr(translation, "greedy_search", recording(translation.greedy_search, False))
    monkeypatch.setattr(translation, "beam_search", recording(translation.beam_search, True))
    line = " ".join(["the"] * 40)
    cap = model.cfg.max_len - 1  # 31 here, while the budget asks for 3 * 41 + 200 tokens
    for beam in (1, 3):
        lengths.clear()
        out = translate_lines(model, vocab, [line, "", "Jesus wept."],
                              DecodeOptions(beam=beam, max_len_a=3.0, max_len_b=200))
        assert len(out) == 3 and out[1] == ""
        assert lengths and max(lengths) == cap, (beam, lengths)
