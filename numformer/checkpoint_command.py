"""The command line ``python -m numformer.checkpoint``: ``average`` checkpoints into one model file
(Section 6.1), ``export`` a model as one ``.npz`` or ``.safetensors`` file, as a Hugging Face Marian folder
or as a CTranslate2 folder, ``import`` a Hugging Face Marian model (opus-mt) as a numformer model file.

    python -m numformer.checkpoint average --out OUT.npz CK1.npz CK2.npz ...
    python -m numformer.checkpoint average --last N RUN_DIR --out RUN_DIR/averaged.npz
    python -m numformer.checkpoint export RUN --format safetensors --out model.safetensors
    python -m numformer.checkpoint export RUN --format hf --out hf_model/
    python -m numformer.checkpoint import Helsinki-NLP/opus-mt-en-de --out opus-en-de.npz

It sits above both the model file (:mod:`numformer.checkpoint`) and the formats of other libraries
(:mod:`numformer.interop`, which read and write model files); ``numformer/checkpoint/__main__.py`` runs it.
"""
from __future__ import annotations

from pathlib import Path

from . import run_file_names
from .checkpoint import CheckpointError, save_checkpoint
from .checkpoint.averaging import average_checkpoints
from .checkpoint.export import FORMATS, export_model
from .checkpoint.output_format import FOLDER_FORMATS, output_format
from .checkpoint.run_model_file import newest_model_file
from .cli.arguments import path_argument, positive_int
from .cli.front import command_line, parser
from .cli.preflight import FILE, NEW_FOLDER, check_output
from .file_kinds import (FOLDER, HF_FOLDER, HF_WEIGHTS, MISSING, MODEL_FILE, RUN_FOLDER, FileKindError, kind_of,
                         shown)
from .interop.ctranslate2 import QUANTIZATIONS, export_ctranslate2
from .interop.marian_export import export_marian_model
from .interop.marian_import import import_marian

PROG = "python -m numformer.checkpoint"


@command_line(PROG)
def main(argv=None) -> int:
    """Run the command; 0 on success, 2 (with one line on stderr) when the checkpoints or the output cannot do."""
    ap = parser(PROG, description="Average checkpoints (Section 6.1) into one model file, export a "
                                "model as one .npz or .safetensors file or a Hugging Face Marian "
                                "folder, or import a Hugging Face Marian model.")
    sub = ap.add_subparsers(dest="command", required=True)
    avg = sub.add_parser("average", help="average the weights of several checkpoints")
    avg.add_argument("inputs", nargs="+", type=path_argument, help="checkpoint files, or one run folder with --last")
    avg.add_argument("--last", type=positive_int, help="average the newest N checkpoints of the run folder given")
    avg.add_argument("--out", required=True, help=f"file to write (e.g. RUN/{run_file_names.AVERAGED})")
    exp = sub.add_parser("export", help="write a model (weights, config, vocabulary) as one file")
    exp.add_argument("source", type=path_argument,
                     help=f"a run folder (its {run_file_names.AVERAGED}, else newest checkpoint) or a checkpoint")
    exp.add_argument("--format", choices=[*FORMATS, *FOLDER_FORMATS],
                     help="npz, safetensors (default: from --out's suffix), hf: a folder MarianMTModel and "
                          "MarianTokenizer load (needs the interop extra to be used, not to be written), or "
                          "ctranslate2: a CTranslate2 model folder (needs ctranslate2)")
    exp.add_argument("--quantization", choices=QUANTIZATIONS,
                     help="with --format ctranslate2: the weights' type in the CTranslate2 model (default float32)")
    exp.add_argument("--out", required=True, help="file to write (model.npz or model.safetensors; a new folder for hf)")
    imp = sub.add_parser("import", help="a Hugging Face Marian model (opus-mt) as a numformer model file")
    imp.add_argument("source", type=path_argument, help="a folder written by MarianMTModel.save_pretrained and "
                                    "MarianTokenizer.save_pretrained, or a Hub id (Helsinki-NLP/opus-mt-en-de: "
                                    "fetched with huggingface_hub, needs a network)")
    imp.add_argument("--out", required=True, help="the numformer model file to write (model.npz)")
    args = ap.parse_args(argv)
    if args.command == "export":
        src = newest_model_file(args.source)
        check_output(args.out, "--out", [args.source, src], NEW_FOLDER if args.format in FOLDER_FORMATS else FILE)
        fmt = output_format(args.out, args.format)
        if fmt == "ctranslate2":
            export_ctranslate2(src, args.out, args.quantization)
        else:
            if args.quantization is not None:
                raise CheckpointError("--quantization is for --format ctranslate2 only: leave it out")
            if fmt == "hf":
                export_marian_model(src, args.out)
            else:
                export_model(src, args.out, fmt)
        print(f"exported {shown(src)} to {shown(args.out)}")
        return 0
    if args.command == "import":
        refuse_import_source(args.source)
        check_output(args.out, "--out", [args.source])
        output_format(args.out, allowed=("npz",))  # a numformer model file (export turns it into the others)
        import_marian(args.source, args.out, log=print)
        print(f"wrote {shown(args.out)}")
        return 0
    paths = checkpoints_to_average(args.inputs, args.last)
    check_output(args.out, "--out", [*args.inputs, *paths])
    output_format(args.out, allowed=("npz",))
    ck = average_checkpoints(paths)
    save_checkpoint(args.out, ck.model, ck.meta, vocab=ck.vocab)
    print(f"averaged {len(paths)} checkpoints into {shown(args.out)}")
    return 0


def refuse_import_source(source) -> None:
    """``import SOURCE`` reads a Hugging Face Marian model's folder: a local path of another kind (a numformer model
    file or run folder, a text file, a metrics log) is a one-line FileKindError naming what it is and what to give.
    A path that does not exist is left to the importer, which takes it for a Hub id; so is a folder of no known
    kind, which the importer names by the file it lacks."""
    kind = kind_of(source)
    if kind in (MISSING, HF_FOLDER, FOLDER):
        return
    p = shown(source)
    if kind in (MODEL_FILE, RUN_FOLDER):
        raise FileKindError(f"{p} is {kind.what} already: nothing to import; give it as it is where a model goes "
                            "(translate.py --model, train.py --init-from)")
    if kind is HF_WEIGHTS:
        raise FileKindError(f"{p} is {kind.what}: give the folder it is in, {shown(Path(source).parent)}, with its "
                            "config.json and tokenizer files")
    raise FileKindError(f"{p} is {kind.what}, not a Hugging Face Marian model: give the folder MarianMTModel."
                        "save_pretrained and MarianTokenizer.save_pretrained wrote, or a Hub id such as "
                        "Helsinki-NLP/opus-mt-en-de")


def checkpoints_to_average(inputs: list, last: int | None) -> list:
    """The files ``average`` reads: the checkpoint files given, or with ``--last N`` the run folder's newest N.

    A run folder given without ``--last`` is the common slip: it is named as such, with the flag that takes
    it, rather than failing later as a file that cannot be read.
    """
    paths = [Path(p) for p in inputs]
    if last is not None:
        if len(paths) != 1 or not paths[0].is_dir():
            raise CheckpointError(f"--last {last} takes one run folder (got {', '.join(map(shown, inputs))}): "
                                  "give the folder train.py --out wrote")
        found = run_file_names.run_checkpoints(paths[0])
        if not found:
            raise CheckpointError(f"no checkpoints in {shown(paths[0] / run_file_names.CHECKPOINTS)}: give the run "
                                  "folder "
                                  "train.py --out wrote")
        return found[-last:]
    folders = [p for p in paths if p.is_dir()]
    if folders:
        raise CheckpointError(f"{shown(folders[0])} is a folder: give checkpoint files, or --last N "
                              f"{shown(folders[0])} to "
                              "average the run's newest N checkpoints")
    return paths
