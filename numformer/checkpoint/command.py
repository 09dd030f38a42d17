"""The command line ``python -m numformer.checkpoint``: ``average`` checkpoints into one model file
(Section 6.1), ``export`` a model as one ``.npz`` or ``.safetensors`` file.

    python -m numformer.checkpoint average --out OUT.npz CK1.npz CK2.npz ...
    python -m numformer.checkpoint average --last N RUN_DIR --out RUN_DIR/averaged.npz
    python -m numformer.checkpoint export RUN --format safetensors --out model.safetensors
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import run_files
from . import CheckpointError, save_checkpoint
from .export import export_model
from .run_model_file import newest_model_file
from .safetensors_file import SafetensorsError
from .averaging import average_checkpoints


def main(argv=None) -> int:
    """Run the command; 0 on success, 2 (with one line on stderr) when the checkpoints or the output cannot do."""
    ap = argparse.ArgumentParser(prog="python -m numformer.checkpoint",
                                 description="Average checkpoints (Section 6.1) into one model file, or export a "
                                             "model as one .npz or .safetensors file.")
    sub = ap.add_subparsers(dest="command", required=True)
    avg = sub.add_parser("average", help="average the weights of several checkpoints")
    avg.add_argument("inputs", nargs="+", help="checkpoint files, or one run folder with --last")
    avg.add_argument("--last", type=int, help="average the newest N checkpoints of the run folder given")
    avg.add_argument("--out", required=True, help=f"file to write (e.g. RUN/{run_files.AVERAGED})")
    exp = sub.add_parser("export", help="write a model (weights, config, vocabulary) as one file")
    exp.add_argument("source", help=f"a run folder (its {run_files.AVERAGED}, else newest checkpoint) or a checkpoint")
    exp.add_argument("--format", choices=["npz", "safetensors"], help="default: from --out's suffix")
    exp.add_argument("--out", required=True, help="file to write (model.npz or model.safetensors)")
    args = ap.parse_args(argv)
    try:
        if args.command == "export":
            src = newest_model_file(args.source)
            export_model(src, args.out, args.format)
            print(f"exported {src} to {args.out}")
            return 0
        paths = [Path(p) for p in args.inputs]
        if args.last:
            if len(paths) != 1 or not paths[0].is_dir():
                raise CheckpointError("--last N takes one run folder")
            paths = run_files.run_checkpoints(paths[0])[-args.last:]
            if not paths:
                raise CheckpointError(f"no checkpoints in {args.inputs[0]}/{run_files.CHECKPOINTS}")
        ck = average_checkpoints(paths)
        save_checkpoint(args.out, ck.model, ck.meta, vocab=ck.vocab)
    except (CheckpointError, SafetensorsError) as exc:
        print(f"numformer.checkpoint: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"numformer.checkpoint: error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints into {args.out}")
    return 0
