"""train.py's data set-up under ``mpirun -n 2`` for tests/data/test_prepare.py: ``mpirun -n 2 python tests/mpi_data_worker.py
CORPUS OUT REPORT_DIR [--hide]``.

Runs what train.py runs before training (rank 0 prepares the corpus into OUT, then every rank gets the
training pairs: ``train._settle`` and ``numformer.training.replicas.share_run``), counts the blocks each rank encoded, and writes per
rank ``REPORT_DIR/rank<r>.json``: whether its training ids are memory-mapped and from which file, the number
of pairs, and the first batch of epoch 0 as the trainer would build it. ``--hide``: rank 1 acts as if it ran
on another host without the files (its map is refused), so rank 0 sends it the arrays.
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402
from numformer.data import plan_batches  # noqa: E402
from numformer.data.encoding import CachedEncoder  # noqa: E402
from numformer.data import prepared_dataset as prepare_module  # noqa: E402
from numformer.cli.one_line_errors import ErrorReport  # noqa: E402
from numformer.training.distributed import init_world  # noqa: E402
from numformer.training.replicas import share_run  # noqa: E402


def main() -> int:
    corpus, out, report = sys.argv[1:4]
    hide = "--hide" in sys.argv[4:]
    world = init_world("cpu")
    encoded = [0]
    real_encode = CachedEncoder.encode

    def counting(self, lines):
        encoded[0] += 1
        return real_encode(self, lines)

    CachedEncoder.encode = counting
    if hide and world.rank == 1:
        prepare_module.open_shared_train = lambda *a: None  # share_run looks it up when it runs
    args = train.parse_args(["--data", corpus, "--out", out, "--preset", "tiny", "--max-steps", "1", "--no-progress"])
    opened = world.on_main(train.open_run, args, "cpu", Path(out), world.size, ErrorReport())  # rank 0: its locked folder, ...
    run, _, data = share_run(world, opened.shared if opened is not None else None)
    tcfg = run.train
    pairs = data.ids["train"]
    plan = plan_batches(*pairs.lengths, tcfg.max_tokens, shuffle_seed=tcfg.seed, epoch=0, max_len=tcfg.max_len)
    batch = pairs.batch(plan[0], data.vocab.pad_id, data.vocab.bos_id, data.vocab.eos_id)
    rec = {"rank": world.rank, "size": world.size, "encoded_blocks": encoded[0],
           "memmap": isinstance(pairs.src_ids, np.memmap),
           "file": str(Path(pairs.src_ids.filename).resolve()) if isinstance(pairs.src_ids, np.memmap) else None,
           "pairs": len(pairs), "src": batch.src.tolist(), "tgt_out": batch.tgt_out.tolist()}
    Path(report, f"rank{world.rank}.json").write_text(json.dumps(rec))
    world.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
