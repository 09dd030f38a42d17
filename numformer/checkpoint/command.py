"""The command line ``python -m numformer.checkpoint``: ``average`` checkpoints into one model file
(Section 6.1), ``export`` a model as one ``.npz`` or ``.safetensors`` file or as a Hugging Face Marian
folder, ``import`` a Hugging Face Marian model (opus-mt) as a numformer model file.

    python -m numformer.checkpoint average --out OUT.npz CK1.npz CK2.npz ...
    python -m numformer.checkpoint average --last N RUN_DIR --out RUN_DIR/averaged.npz
    python -m numformer.checkpoint export RUN --format safetensors --out model.safetensors
    python -m numformer.checkpoint export RUN --format hf --out hf_model/
    python -m numformer.checkpoint import Helsinki-NLP/opus-mt-en-de --out opus-en-de.npz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import run_files
from ..errors import NumformerError
from ..files import refuse_output_over_inputs
from . import CheckpointError, save_checkpoint
from .export import FORMATS, export_model
from .run_model_file import newest_model_file
from .averaging import average_checkpoints


def main(argv=None) -> int:
    """Run the command; 0 on success, 2 (with one line on stderr) when the checkpoints or the output cannot do."""
    ap = argparse.ArgumentParser(prog="python -m numformer.checkpoint",
                                 description="Average checkpoints (Section 6.1) into one model file, export a "
                                             "model as one .npz or .safetensors file or a Hugging Face Marian "
                                             "folder, or import a Hugging Face Marian model.")
    sub = ap.add_subparsers(dest="command", required=True)
    avg = sub.add_parser("average", help="average the weights of several checkpoints")
    avg.add_argument("inputs", nargs="+", help="checkpoint files, or one run folder with --last")
    avg.add_argument("--last", type=int, help="average the newest N checkpoints of the run folder given")
    avg.add_argument("--out", required=True, help=f"file to write (e.g. RUN/{run_files.AVERAGED})")
    exp = sub.add_parser("export", help="write a model (weights, config, vocabulary) as one file")
    exp.add_argument("source", help=f"a run folder (its {run_files.AVERAGED}, else newest checkpoint) or a checkpoint")
    exp.add_argument("--format", choices=[*FORMATS, "ctranslate2"],
                     help="npz, safetensors (default: from --out's suffix), hf: a folder MarianMTModel and "
                          "MarianTokenizer load (needs the interop extra to be used, not to be written), or "
                          "ctranslate2: a CTranslate2 model folder (needs ctranslate2)")
    exp.add_argument("--quantization", choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                                                "float16", "bfloat16", "float32"],
                     help="with --format ctranslate2: the weights' type in the CTranslate2 model (default float32)")
    exp.add_argument("--out", required=True, help="file to write (model.npz or model.safetensors; a new folder for hf)")
    imp = sub.add_parser("import", help="a Hugging Face Marian model (opus-mt) as a numformer model file")
    imp.add_argument("source", help="a folder written by MarianMTModel.save_pretrained and "
                                    "MarianTokenizer.save_pretrained, or a Hub id (Helsinki-NLP/opus-mt-en-de: "
                                    "fetched with huggingface_hub, needs a network)")
    imp.add_argument("--out", required=True, help="the numformer model file to write (model.npz)")
    args = ap.parse_args(argv)
    try:
        if args.command == "export":
            src = newest_model_file(args.source)
            refuse_output_over_inputs(args.out, [args.source, src])
            if args.format == "ctranslate2":
                from ..interop.ctranslate2 import export_ctranslate2  # noqa: PLC0415

                export_ctranslate2(src, args.out, args.quantization)
            else:
                if args.quantization is not None:
                    raise CheckpointError("--quantization is for --format ctranslate2 only: leave it out")
                export_model(src, args.out, args.format)
            print(f"exported {src} to {args.out}")
            return 0
        if args.command == "import":
            from ..interop.marian import import_marian  # noqa: PLC0415

            refuse_output_over_inputs(args.out, [args.source])
            import_marian(args.source, args.out, log=print)
            print(f"wrote {args.out}")
            return 0
        paths = [Path(p) for p in args.inputs]
        if args.last:
            if len(paths) != 1 or not paths[0].is_dir():
                raise CheckpointError("--last N takes one run folder")
            paths = run_files.run_checkpoints(paths[0])[-args.last:]
            if not paths:
                raise CheckpointError(f"no checkpoints in {args.inputs[0]}/{run_files.CHECKPOINTS}")
        refuse_output_over_inputs(args.out, [*args.inputs, *paths])
        ck = average_checkpoints(paths)
        save_checkpoint(args.out, ck.model, ck.meta, vocab=ck.vocab)
    except NumformerError as exc:  # a checkpoint, a safetensors file, a vocabulary, a model from elsewhere
        print(f"numformer.checkpoint: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"numformer.checkpoint: error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints into {args.out}")
    return 0
