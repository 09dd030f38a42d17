"""Helpers shared by test files of several subjects (one place, so that no test file imports another).

In-process command lines (``run_main``) and their one-line errors, the argument list of a tiny copy-task
run, small corpora and run folders (a trained copy run and a random-weight run with a byte-fallback
vocabulary, as session-wide fixtures registered by conftest.py), damaged checkpoints, the comparison of
two training states, the host thread count as a fixture, the MPI launch prefix, the key biases' rule and the
import of a script by its path.
"""
import os
import shutil
import signal
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from numformer.checkpoint import load_checkpoint, save_checkpoint, vocab_fingerprint  # noqa: E402
from numformer.data import CORPUS_FILES, SubwordVocab  # noqa: E402
from numformer.kernels.host import threads as host_threads  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.presets import get_preset  # noqa: E402


def no_exact_gradient(name: str) -> bool:
    """Whether parameter ``name`` is a key-projection bias: its gradient is zero in exact arithmetic (softmax ignores
    a shift of a whole row of scores, and q.(k + b) shifts row q by q.b), so what it holds is rounding noise, which
    two computations of the same thing (two devices, two orders of a sum, Adam's scaling of it) need not share."""
    return name.endswith("w_k.bias")


def load_file_module(path: Path, name: str):
    """The Python file ``path`` (a bench script, tests/mpi_worker.py) imported as module ``name``, without running
    its ``__main__`` block and without putting its folder on the path."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_available() -> bool:
    try:
        from numformer.backend import import_cupy  # noqa: PLC0415

        import_cupy()
        return True
    except Exception:  # noqa: BLE001
        return False


TEXT = [
    "In the beginning God created the heavens and the earth.",
    "En el principio creó Dios los cielos y la tierra.",
    "Jesus wept. Jesús lloró.",
    "Привет мир, 你好世界, مرحبا بالعالم, γειά σου κόσμε 😀",
] * 5


def copy_args(out, steps=6, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "3", "--eval-every", "0", "--no-test", "--log-every", "1", "--max-tokens", "400",
            "--average-last", "1", *extra]


def resume_args(out, steps, *extra):
    return ["--out", str(out), "--resume", "--max-steps", str(steps), "--no-progress", "--no-test", *extra]


def run_main(main, argv, capsys):
    """Run a CLI main in-process; returns (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, prog, needle, status=2):
    assert code == status, (code, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error:"), err
    assert needle.lower() in lines[0].lower(), (needle, err)


@pytest.fixture(scope="session")
def copy_run(tmp_path_factory):
    """A tiny model trained 6 steps on the copy task: checkpoints at 3 and 6, spm.model, run.json."""
    out = tmp_path_factory.mktemp("copy") / "run"
    assert train.main(copy_args(out)) == 0
    return out


@pytest.fixture
def run_copy(copy_run, tmp_path):
    """A private copy of copy_run (for tests that change it)."""
    return Path(shutil.copytree(copy_run, tmp_path / "run"))


VOCAB_SIZE = 400


def make_random_run(folder, max_len=32):
    """A run folder with a random-weight model (1 layer, d_model 16, positional table ``max_len``) and a
    byte-fallback vocabulary: such a vocabulary can emit <0x0A>, i.e. a newline, from a random model."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = SubwordVocab.train(TEXT, folder / "spm", VOCAB_SIZE, byte_fallback=True)
    cfg = get_preset("tiny", vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=1, max_len=max_len)
    model = Transformer(cfg, seed=0)
    meta = {"model_config": cfg.to_dict(), "vocab_sha256": vocab_fingerprint(vocab), "step": 1}
    save_checkpoint(folder / "checkpoints" / "step_0000001.npz", model.state_dict(), meta)
    return folder


@pytest.fixture(scope="session")
def random_run(tmp_path_factory):
    return make_random_run(tmp_path_factory.mktemp("random") / "run")


def write_corpus(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        data = files.get(name, "one two three\nfour five six\n")
        (folder / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return folder


def corrupt(kind, path):
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "junk":
        path.write_bytes(b"this is not a checkpoint" * 100)
    elif kind == "flipped bytes":  # 64 bytes in the middle of the largest weight's data (the zip's CRC-32
        mid = weight_data_middle(path, data)  # catches it): never the npy header, never padding
        path.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid: mid + 64]) + data[mid + 64:])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "no meta":
        np.savez(path, x=np.zeros(3))
    elif kind == "wrong shapes":
        ck = load_checkpoint(path)
        ck.meta["model_config"]["d_ff"] = 64
        save_checkpoint(path, ck.model, ck.meta)
    elif kind == "bad config":
        ck = load_checkpoint(path)
        ck.meta["model_config"]["colour"] = "blue"
        save_checkpoint(path, ck.model, ck.meta)


def weight_data_middle(path, data):
    """The file offset of the middle of the largest ``model/`` array's data: after the zip's local header
    (its own name and extra-field lengths, read from the file) and after the .npy header."""
    import struct

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if i.filename.startswith("model/")), key=lambda i: i.file_size)
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            read_header(f)
            npy_header = f.tell()
    assert info.compress_type == zipfile.ZIP_STORED  # np.savez stores: file bytes are the .npy bytes
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + npy_header
    n_data = info.file_size - npy_header
    assert n_data >= 1024, "the largest weight is too small to corrupt 64 bytes of it"
    return start + n_data // 2


def assert_same_training_state(path_a, path_b):
    """Every weight and Adam moment of the two checkpoints equal bit for bit, and the same data position."""
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    assert a.model.keys() == b.model.keys()
    for name in a.model:
        assert np.array_equal(a.model[name], b.model[name]), name
    for x, y in zip(a.optimizer["m"] + a.optimizer["v"], b.optimizer["m"] + b.optimizer["v"]):
        assert np.array_equal(x, y)
    assert a.optimizer["step_count"] == b.optimizer["step_count"]
    assert (a.meta["epoch"], a.meta["batch_pos"]) == (b.meta["epoch"], b.meta["batch_pos"])


@pytest.fixture(params=[2, 3], ids=lambda n: f"{n}threads")
def threads(request):
    old = host_threads.get_num_threads()
    host_threads.set_num_threads(request.param)
    yield request.param
    host_threads.set_num_threads(old)


# One thread per process: two ranks share the two cores, and equal thread counts keep BLAS's arithmetic
# the same in the 1-process run and the 2-process run.
# One thread per process: two ranks share the two cores, and equal thread counts keep BLAS's arithmetic
# the same in the 1-process run and the 2-process run.
ENV = dict(os.environ, NUMFORMER_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
           OMPI_MCA_btl="^openib")  # no InfiniBand probing (and no warning about it) on a plain machine


def mpirun(n=2):
    """The launch prefix: Open MPI's mpirun, as root in CI, more ranks than cores allowed, no core binding."""
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.fail("mpirun not found: bash .ci/setup installs openmpi-bin and mpi4py")
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [exe, "-n", str(n), *root, "--oversubscribe", "--bind-to", "none"]


def save_wmt14_dataset(folder, splits: dict, src: str = "en", tgt: str = "de"):
    """A local copy of the datasets library's ``wmt14`` dataset, as a user's ``save_to_disk`` writes it: splits
    train / validation / test, one column ``translation`` of the ``Translation`` feature ({lang: text}).
    ``splits``: {split: [(source text, target text), ...]}."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"translation": datasets.Translation(languages=[tgt, src])})
    datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"translation": [{tgt: t, src: s} for s, t in pairs]}, features=features)
        for name, pairs in splits.items()}).save_to_disk(str(folder))
    return folder


def as_a_terminal_starts_it() -> None:
    """``preexec_fn`` of a command these tests stop with a signal: the stop signals at their defaults, as a terminal's
    shell starts a command, whatever the test run itself inherited (under ``nohup`` SIGHUP is ignored; an ignored
    disposition survives exec, and numformer keeps it ignored, as nohup asks: the child would not stop at the
    hang-up the test sends)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
