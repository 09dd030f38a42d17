"""Runs every command shown in README.md and docs/*.md, with small settings where the real one is long.

    python3 tests/check_docs_commands.py            # every command (about 10-20 minutes on 2 cores)
    python3 tests/check_docs_commands.py --list     # the table: each command shown and what is run for it

A command is a line of a ```bash block (a ``for ... done`` loop is one command). :data:`COMMANDS`
holds, for each, what this script runs: the command itself, a smaller version of it (fewer steps,
sentences, presets), a check up to the hardware it needs (a GPU command must end in the one-line
"no GPU" error, exit 2, when there is none), or a reason it is not run here. They run in the table's
order in a scratch folder that looks like the repository (``train.py``, ``translate.py``, ``bench/``,
``tests/`` linked in; ``runs/``, ``docs/img/`` and the example files its own), so that a command that
needs a trained model finds the one an earlier command trained. ``tests/cli/test_docs_commands.py``
(CI) checks that this table and the documents list the same commands; this script, run by hand, runs them.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SMALL_BIBLE = "--max-steps 4 --save-every 2 --save-every-minutes 0 --eval-every 0 --log-every 1 --no-test"
NO_GPU = "expect-no-gpu"   # run; it must stop with the one-line error of a machine without a GPU (exit 2)

#: The recipe sweeps' commands (docs/results.md): too long to run here.
SWEEP_POINTS = ("skip", "10 minutes of training a point (tests/training/test_recipe_sweep.py runs a tiny sweep)")

# shown command -> (kind, what runs). kind: "run" (exactly that), "small" (a smaller version, given),
# NO_GPU (that, up to the missing GPU), "skip" (the reason it is not run here). In the table's order.
COMMANDS: dict[str, tuple[str, str]] = {
    # -- the corpus and the main job (small), which later commands translate with ---------------------------
    "python3 -m numformer.data.bible": ("run", "python3 -m numformer.data.bible"),
    "python3 -m numformer.data.messages": ("run", "python3 -m numformer.data.messages"),
    "python3 -m numformer.data.messages --language de --out corpora/messages-en-de":
        ("run", "python3 -m numformer.data.messages --language de --out corpora/messages-en-de"),
    "python3 train.py --data corpora/messages-en-de --max-minutes 10":
        ("small", f"python3 train.py --data corpora/messages-en-de --out runs/messages-de {SMALL_BIBLE}"),
    "python3 train.py --corpus messages-en-es":
        ("small", f"python3 train.py --corpus messages-en-es --out runs/messages {SMALL_BIBLE}"),
    "bash .ci/setup && python3 train.py --corpus bible-en-es":
        ("small", f"python3 train.py --corpus bible-en-es {SMALL_BIBLE}"),
    "python3 train.py --corpus bible-en-es": ("small", f"python3 train.py --corpus bible-en-es --out runs/main-2 {SMALL_BIBLE}"),
    "python3 train.py --out runs/bible-en-es-small --resume":
        ("small", "python3 train.py --out runs/bible-en-es-small --resume --max-steps 6 --no-test"),
    "python3 -m numformer.checkpoint average --last 5 runs/bible-en-es-small --out runs/bible-en-es-small/averaged.npz":
        ("run", "python3 -m numformer.checkpoint average --last 5 runs/bible-en-es-small --out "
                "runs/bible-en-es-small/averaged.npz"),
    "python3 translate.py --model runs/bible-en-es-small --input test.en --output test.es.hyp":
        ("run", "python3 translate.py --model runs/bible-en-es-small --input test.en --output test.es.hyp"),
    'echo "Jesus wept." | python3 translate.py --model runs/bible-en-es-small':
        ("run", 'echo "Jesus wept." | python3 translate.py --model runs/bible-en-es-small'),
    "python3 translate.py --model runs/bible-en-es-small --input test.en --reference test.es":
        ("run", "python3 translate.py --model runs/bible-en-es-small --input test.en --reference test.es"),
    "python3 translate.py --model runs/bible-en-es-small":
        ("small", 'echo "Jesus wept." | python3 translate.py --model runs/bible-en-es-small  # a pipe, not a terminal'),
    "cp runs/bible-en-es-small/averaged.npz /tmp/model.npz":
        ("small", "cp runs/bible-en-es-small/averaged.npz model-copy.npz  # the scratch folder, not /tmp"),
    "python3 translate.py --model /tmp/model.npz --input test.en":
        ("small", "mkdir -p elsewhere && mv model-copy.npz elsewhere/model.npz && "
                  "python3 translate.py --model elsewhere/model.npz --input test.en"),
    "python3 -m numformer.checkpoint export runs/bible-en-es-small --out model.npz":
        ("run", "python3 -m numformer.checkpoint export runs/bible-en-es-small --out model.npz"),
    "python3 -m numformer.checkpoint export runs/bible-en-es-small --format safetensors --out model.safetensors":
        ("run", "python3 -m numformer.checkpoint export runs/bible-en-es-small --format safetensors --out "
                "model.safetensors"),
    "python3 translate.py --model model.safetensors --input test.en":
        ("run", "python3 translate.py --model model.safetensors --input test.en"),
    "python3 -m numformer.plot runs/bible-en-es-small": ("run", "python3 -m numformer.plot runs/bible-en-es-small"),
    'python3 -m numformer.attention_maps --model runs/bible-en-es-small --sentence "Those who regard vain idols '
    'forsake their own mercy." --out attention.png':
        ("run", 'python3 -m numformer.attention_maps --model runs/bible-en-es-small --sentence "Those who regard vain '
                'idols forsake their own mercy." --out attention.png'),
    "python3 -m grad_checks --checkpoint runs/bible-en-es-small":
        ("small", "python3 -m grad_checks --checkpoint runs/bible-en-es-small --layer Linear --layer LayerNorm"),
    "python3 bench/decode.py --model runs/bible-en-es-small --sentences 0 --threads 2":
        ("small", "python3 bench/decode.py --model runs/bible-en-es-small --sentences 5 --threads 2 --step-repeat 1 "
                  "--step-positions 5"),
    "python3 bench/decode.py --model runs/bible-en-es-small --sentences 300 --dtype float64 --no-uncached":
        ("small", "python3 bench/decode.py --model runs/bible-en-es-small --sentences 5 --dtype float64 --no-uncached "
                  "--step-repeat 1 --step-positions 5"),
    "python3 train.py --corpus bible-en-es --log-grads 100 --out runs/bible-log-grads":
        ("small", f"python3 train.py --corpus bible-en-es --log-grads 2 --out runs/bible-log-grads {SMALL_BIBLE}"),
    "python3 train.py --corpus bible-en-es --max-steps 500 --eval-every 500 --no-test --init xavier --out runs/init-xavier":
        ("small", "python3 train.py --corpus bible-en-es --max-steps 2 --eval-every 2 --eval-sentences 2 --no-test "
                  "--init xavier --out runs/init-xavier"),
    "for norm in post pre; do ... done": (  # the warmup comparison of docs/results.md
        "small", 'for norm in post pre; do extra=""; [ $norm = pre ] && extra="--pre-norm"; '
                 "python3 train.py --corpus bible-en-es --preset small $extra --max-steps 2 --log-grads 2 --log-every 2 "
                 "--eval-every 0 --no-test --no-progress --out runs/warmup/$norm-warmup500 && "
                 "python3 train.py --corpus bible-en-es --preset small $extra --max-steps 2 --log-grads 2 --log-every 2 "
                 "--eval-every 0 --no-test --no-progress --warmup 1 --lr-factor 0.0313 --out runs/warmup/$norm-nowarmup "
                 "|| exit 1; done"),
    "python3 -m numformer.plot --compare runs/warmup/post-warmup500 runs/warmup/post-nowarmup runs/warmup/pre-warmup500 "
    "runs/warmup/pre-nowarmup --out docs/img/warmup.png":
        ("run", "python3 -m numformer.plot --compare runs/warmup/post-warmup500 runs/warmup/post-nowarmup "
                "runs/warmup/pre-warmup500 runs/warmup/pre-nowarmup --out docs/img/warmup.png  # the scratch docs/img"),
    # -- the first run, and a user's corpus ---------------------------------------------------------------------
    "bash .ci/setup && python3 train.py --task reverse --preset tiny --max-steps 3000":
        ("small", "python3 train.py --task reverse --preset tiny --max-steps 30 --no-test"),
    "python3 train.py --task reverse --preset tiny --max-steps 3000":
        ("small", "python3 train.py --task reverse --preset tiny --max-steps 30 --no-test --out runs/reverse-2"),
    'echo "n u m f o r m e r" | python3 translate.py --model runs/reverse-tiny':
        ("run", 'echo "n u m f o r m e r" | python3 translate.py --model runs/reverse-tiny'),
    "python3 train.py --data DIR --preset small --max-minutes 60":
        ("small", "python3 train.py --data DIR --preset small --max-minutes 60 --max-steps 2 --eval-every 0 --no-test "
                  "--vocab-size 400  # DIR: 2,000 pairs of the bible corpus"),
    "python3 -m numformer.prepare --data wmt14-en-de/ --out runs/ende":
        ("small", "python3 -m numformer.prepare --data wmt14-en-de/ --out runs/ende --vocab-size 400"
                  "  # wmt14-en-de/: 2,000 pairs of the bible corpus"),
    # -- gradients ----------------------------------------------------------------------------------------------
    "python3 -m grad_checks --layer LayerNorm --verbose": ("run", "python3 -m grad_checks --layer LayerNorm --verbose"),
    "python3 -m grad_checks --layer ScaledDotProductAttention --verbose":
        ("run", "python3 -m grad_checks --layer ScaledDotProductAttention --verbose"),
    "python3 -m grad_checks --layer MultiHeadAttention --verbose":
        ("run", "python3 -m grad_checks --layer MultiHeadAttention --verbose"),
    "python3 -m grad_checks --json": ("run", "python3 -m grad_checks --json"),
    "python3 -m grad_checks": ("small", "python3 -m grad_checks --layer Linear --layer Transformer"),
    "python3 -m grad_checks --kernels plain": ("small", "python3 -m grad_checks --kernels plain --layer Linear"),
    "python3 -m grad_checks --layer LayerNorm --mode forward":
        ("run", "python3 -m grad_checks --layer LayerNorm --mode forward"),
    "python3 -m pytest -q tests/checks/test_torch_parity.py":
        ("small", "python3 -m pytest -q -p no:cacheprovider tests/checks/test_torch_parity.py -k linear"),
    "python3 -m pytest -q tests/checks/test_torch_parity.py -rs":
        ("small", "python3 -m pytest -q -p no:cacheprovider tests/checks/test_torch_parity.py -rs -k layernorm"),
    "bash .ci/setup && python3 -m pytest -q": ("skip", "the whole suite: CI runs it on every commit"),
    "python3 tests/cpu_matrix.py --list": ("run", "python3 tests/cpu_matrix.py --list"),
    "python3 tests/cpu_matrix.py": ("small", "python3 tests/cpu_matrix.py --configs threads-1 --suites kernels -k "
                                             "'layernorm_forward and batch-of-one'"),
    "python3 tests/cpu_matrix.py --ci": ("skip", "CI runs it on every commit (.ci/run)"),
    "python3 tests/cpu_matrix.py --configs ct2-GENERIC,ct2-mkl --suites interop":
        ("small", "python3 tests/cpu_matrix.py --configs ct2-mkl --suites interop -k int8"),
    'eval "$(python3 tests/cpu_matrix.py --export avx2-only)" && python3 -m pytest -q':
        ("skip", "CI runs the suite so on every commit (.ci/run)"),
    'eval "$(python3 tests/cpu_matrix.py --export avx2-only)"':
        ("run", 'eval "$(python3 tests/cpu_matrix.py --export avx2-only)"'),
    # -- speed --------------------------------------------------------------------------------------------------
    "python3 bench/train_step.py --preset tiny,small,base --steps 15 --repeat 3":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-compile"),
    "NUMFORMER_KERNELS=plain python3 bench/train_step.py --preset tiny,small,base --steps 15 --repeat 3 --no-torch":
        ("small", "NUMFORMER_KERNELS=plain python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-torch"),
    "python3 bench/train_step.py --preset tiny,small --steps 6 --repeat 2 --threads 1":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --threads 1 --no-compile"),
    "python3 bench/per_sentence_cost.py --preset small --steps 10 --warmup 2 --repeat 3":
        ("small", "python3 bench/per_sentence_cost.py --preset tiny --steps 2 --warmup 1"),
    "python3 bench/hvp_cost.py --preset tiny,small,base --steps 3 --warmup 1 --repeat 3":
        ("small", "python3 bench/hvp_cost.py --preset tiny --steps 1 --warmup 0  # small, base: the same code"),
    "python3 bench/train_step.py --preset base --steps 4 --warmup 2 --threads 1":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --threads 1 --no-torch"
                  "  # base: the same code at another size"),
    "python3 bench/decode.py --model runs/bible-en-es-small --sentences 300 --no-uncached --ct2-compute-types float32":
        ("small", "python3 bench/decode.py --model runs/bible-en-es-small --sentences 5 --no-uncached --ct2-compute-types "
                  "float32 --step-repeat 1 --step-positions 5"),
    "python3 bench/decode_profile.py --model runs/bible-en-es-small --sentences 75 --cached 25 --source 52 --calls 30 "
    "--repeat 2":
        ("small", "python3 bench/decode_profile.py --model runs/bible-en-es-small --sentences 3 --cached 3 --source 5 "
                  "--calls 1 --repeat 1"),
    "python3 bench/train_step.py --preset tiny,small --steps 10 --repeat 1 --no-compile":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-compile"),
    "python3 bench/train_step.py --preset tiny,small --steps 10 --repeat 2 --no-compile":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-compile"),
    "python3 bench/train_step.py --preset tiny,small --corpus bible-en-es --batches 40 --repeat 2":
        ("small", "python3 bench/train_step.py --preset tiny --corpus bible-en-es --batches 2 --warmup 1"),
    "python3 bench/train_step.py --preset base --steps 4 --warmup 2 --repeat 1 --no-compile":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-compile  # base: the same code"),
    "python3 bench/train_step.py --preset base --steps 6 --warmup 2 --repeat 1 --no-compile":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-compile  # base: the same code"),
    "for s in tiny small base; do ... done":
        ("small", "python3 bench/step_breakdown.py --device cpu --shape tiny --steps 1 --warmup 0  # base: the same code"),
    "python3 bench/train_step.py --preset tiny,small --steps 10 --repeat 1 --no-torch":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-torch"),
    "python3 bench/train_step.py --preset base --steps 4 --warmup 2 --repeat 1 --no-torch":
        ("small", "python3 bench/train_step.py --preset tiny --steps 2 --warmup 1 --no-torch  # base: the same code"),
    "mpirun -n 2 python3 bench/data_parallel.py --allreduce 52000000 --bucket-elements 524288":
        ("small", "mpirun -n 2 --allow-run-as-root --oversubscribe python3 bench/data_parallel.py --allreduce 100000 "
                  "--bucket-elements 16384"),
    "python3 bench/step_python_calls.py --preset base": ("run", "python3 bench/step_python_calls.py --preset base"),
    "python3 bench/kernel_speed.py --calls 15": ("small", "python3 bench/kernel_speed.py --calls 1 --size batch-of-one"),
    "python3 bench/data_scale.py --pairs 500000,1500000,4500000":
        ("small", "python3 bench/data_scale.py --pairs 20000 --steps 1 --vocab-size 500"),
    "python3 bench/data_parallel.py --corpus bible-en-es --preset small --steps 40 --repeat 2":
        ("small", "python3 bench/data_parallel.py --task copy --preset tiny --steps 3 --log-every 1 --configs 1x1,2x1"),
    # -- exercises (tests/exercises/test_exercises_doc.py also runs docs/exercises.md's walk-through as written) --
    "python -m grad_checks exercise --list": ("run", "python -m grad_checks exercise --list"),
    "python -m grad_checks exercise layernorm --out lab": ("run", "python -m grad_checks exercise layernorm --out lab"),
    "python -m grad_checks check lab/my_layernorm.py":
        ("small", "python3 -c \"import sys; sys.path.insert(0, 'tests'); from pathlib import Path; import lab_files; "
                  "from grad_checks import exercises; ex = exercises.get('layernorm'); "
                  "lab_files.write(ex, ex.target, Path('lab'))\" && python -m grad_checks check lab/my_layernorm.py"
                  "  # solved first (the unsolved file's grade, exit 1, is the walk-through test's)"),
    "python3 train.py --task copy --preset tiny --max-steps 300 --no-test --swap LayerNorm=lab/my_layernorm.py:LayerNorm "
    "--out runs/my-layernorm":
        ("small", "python3 train.py --task copy --preset tiny --max-steps 3 --no-test "
                  "--swap LayerNorm=lab/my_layernorm.py:LayerNorm --out runs/my-layernorm"),
    "python3 train.py --corpus bible-en-es --preset small --max-steps 300 --no-test --out runs/bible-plain":
        ("small", f"python3 train.py --corpus bible-en-es --preset small --out runs/bible-plain {SMALL_BIBLE}"),
    "python3 train.py --corpus bible-en-es --preset small --max-steps 300 --no-test --out runs/bible-mine "
    "--swap LayerNorm=lab/my_layernorm.py:LayerNorm":
        ("small", f"python3 train.py --corpus bible-en-es --preset small --out runs/bible-mine "
                  f"--swap LayerNorm=lab/my_layernorm.py:LayerNorm {SMALL_BIBLE}"),
    "python -m grad_checks hint lab/my_layernorm.py": ("run", "python -m grad_checks hint lab/my_layernorm.py"),
    "python -m grad_checks exercise --status lab":
        ("small", "python -m grad_checks exercise --status lab; test $? -eq 1  # exit 1 until all thirteen are exact"),
    "python3 train.py --task copy --preset tiny --max-steps 300 --no-test --swap all=lab --out runs/all-mine":
        ("small", "python3 train.py --task copy --preset tiny --max-steps 3 --no-test --swap all=lab --out runs/all-mine"),
    "python3 train.py --corpus bible-en-es --preset small --max-steps 300 --no-test --out runs/bible-numformer":
        ("small", f"python3 train.py --corpus bible-en-es --preset small --out runs/bible-numformer {SMALL_BIBLE}"),
    "python3 train.py --corpus bible-en-es --preset small --max-steps 300 --no-test --out runs/bible-all-mine "
    "--swap all=lab":
        ("small", "python3 -c \"import sys; sys.path.insert(0, 'tests'); from pathlib import Path; import lab_files; "
                  "from grad_checks import exercises; Path('lab').mkdir(exist_ok=True); [lab_files.write(ex, ex.target, Path('lab')) "
                  "for ex in exercises.all_exercises()]\" && python3 train.py --corpus bible-en-es --preset small "
                  f"--out runs/bible-all-mine --swap all=lab {SMALL_BIBLE}  # every exercise solved first"),
    "python -m grad_checks exercise softmax --out mistakes": ("run", "python -m grad_checks exercise softmax --out mistakes"),
    "python -m grad_checks exercise layernorm --out mistakes": ("run", "python -m grad_checks exercise layernorm --out mistakes"),
    "python -m grad_checks exercise attention --out mistakes": ("run", "python -m grad_checks exercise attention --out mistakes"),
    "python -m grad_checks exercise embedding --out mistakes": ("run", "python -m grad_checks exercise embedding --out mistakes"),
    "python -m grad_checks check mistakes/my_softmax.py":
        ("small", "python -m grad_checks check mistakes/my_softmax.py; test $? -eq 1  # a wrong (or unwritten) answer: exit 1"),
    "python -m grad_checks check mistakes/my_layernorm.py":
        ("small", "python -m grad_checks check mistakes/my_layernorm.py; test $? -eq 1  # a wrong (or unwritten) answer: exit 1"),
    "python -m grad_checks check mistakes/my_attention.py":
        ("small", "python -m grad_checks check mistakes/my_attention.py; test $? -eq 1  # a wrong (or unwritten) answer: exit 1"),
    "python -m grad_checks check mistakes/my_embedding.py":
        ("small", "python -m grad_checks check mistakes/my_embedding.py; test $? -eq 1  # a wrong (or unwritten) answer: exit 1"),
    # -- studies and TensorBoard -------------------------------------------------------------------------------
    "python3 -m numformer.studies --list": ("run", "python3 -m numformer.studies --list"),
    "python3 -m numformer.studies NAME --small": ("run", "python3 -m numformer.studies output-change --small"),
    "python3 -m numformer.studies NAME [--out DIR]":
        ("small", "python3 -m numformer.studies ln-placement --small --out runs/studies  # the full one: minutes"),
    "python3 -m numformer.studies ln-placement --out runs/studies":
        ("small", "python3 -m numformer.studies ln-placement --small --out runs/studies  # the full one: minutes"),
    "python3 -m numformer.studies table3 --rows A,D,E --seeds 1,2":
        ("small", "python3 -m numformer.studies table3 --small --rows A-h1 --seeds 1,2 --out runs/studies-table3"
                  "  # the full one: about an hour"),
    "pip install -e '.[tensorboard]'": ("skip", "bash .ci/setup installs this extra (the check runs in its tree)"),
    "python3 train.py --corpus bible-en-es --tensorboard --log-grads 100":
        ("small", f"python3 train.py --corpus bible-en-es --tensorboard --log-grads 2 --out runs/bible-tb {SMALL_BIBLE}"),
    "tensorboard --logdir runs/bible-en-es-small":
        ("small", "tensorboard --inspect --logdir runs/bible-tb  # lists the run's events instead of serving them"),
    # -- several processes ---------------------------------------------------------------------------------------
    "mpirun -n 2 python3 train.py --corpus bible-en-es":
        ("small", "mpirun -n 2 --allow-run-as-root --oversubscribe python3 train.py --corpus bible-en-es "
                  f"--out runs/mpi-2 {SMALL_BIBLE}  # as root, Open MPI wants --allow-run-as-root"),
    "mpirun -n 4 python3 train.py --out runs/bible-en-es-base --resume":
        ("small", "mpirun -n 2 --allow-run-as-root --oversubscribe python3 train.py --out runs/mpi-2 --resume "
                  "--max-steps 6 --no-test  # a CPU run resumed under mpirun; the GPU run it names needs GPUs"),
    "mpirun -n 4 python3 train.py --corpus bible-en-es --device cuda --max-tokens 12500 --accum 1":
        ("skip", "needs 4 GPUs"),
    "mpirun -n 16 --hostfile hosts -x PATH -x LD_LIBRARY_PATH python3 train.py --corpus bible-en-es --device cuda "
    "--max-tokens 3125 --accum 1 --out runs/bible-base-16": ("skip", "needs 2 hosts with 8 GPUs each"),
    # -- the GPU: up to the missing GPU ------------------------------------------------------------------------------
    "python3 train.py --corpus bible-en-es --device cuda": (NO_GPU, "python3 train.py --corpus bible-en-es --device cuda"),
    "python3 train.py --corpus bible-en-es --device cuda --precision tf32":
        (NO_GPU, "python3 train.py --corpus bible-en-es --device cuda --precision tf32"),
    "python3 train.py --corpus bible-en-es --device cuda --precision fp16":
        (NO_GPU, "python3 train.py --corpus bible-en-es --device cuda --precision fp16"),
    "python3 train.py --corpus bible-en-es --device cuda --cuda-graphs":
        (NO_GPU, "python3 train.py --corpus bible-en-es --device cuda --cuda-graphs"),
    "python3 train.py --data wmt14-en-de/ --out runs/ende --device cuda":
        (NO_GPU, "python3 train.py --data wmt14-en-de/ --out runs/ende --device cuda"),
    # -- the paper's experiment (docs/paper.md): WMT 2014 is not here and neither is a GPU ----------------------------
    "python3 train.py --corpus wmt14-en-de --device cuda": (NO_GPU, "python3 train.py --corpus wmt14-en-de --device cuda"),
    "python3 train.py --corpus wmt14-en-de --preset big --device cuda":
        (NO_GPU, "python3 train.py --corpus wmt14-en-de --preset big --device cuda"),
    "python3 train.py --corpus wmt14-en-fr --preset big --device cuda":
        (NO_GPU, "python3 train.py --corpus wmt14-en-fr --preset big --device cuda"),
    "python3 train.py --corpus wmt14-en-de --wmt-dir ~/wmt14 --device cuda":
        (NO_GPU, "python3 train.py --corpus wmt14-en-de --wmt-dir ~/wmt14 --device cuda"),
    "mpirun -n 8 python3 train.py --corpus wmt14-en-de --device cuda": ("skip", "needs 8 GPUs and WMT 2014"),
    "python3 bench/wmt_shaped_corpus.py --out /tmp/wmt-shaped":
        ("small", "python3 bench/wmt_shaped_corpus.py --out wmt-shaped --pairs 3000  # the scratch folder, fewer pairs"),
    "NUMFORMER_CACHE=/tmp/wmt-cache python3 train.py --corpus wmt14-en-de --wmt-dir /tmp/wmt-shaped --max-steps 3 "
    "--eval-every 0 --no-test --out runs/wmt-step-time":
        ("small", "NUMFORMER_CACHE=wmt-cache python3 train.py --corpus wmt14-en-de --wmt-dir wmt-shaped --preset tiny "
                  "--vocab-size 2000 --max-steps 3 --eval-every 0 --no-test --no-progress --out runs/wmt-step-time"),
    "NUMFORMER_CACHE=/tmp/wmt-cache python3 train.py --corpus wmt14-en-de --preset big --wmt-dir /tmp/wmt-shaped "
    "--max-steps 2 --eval-every 0 --no-test --out runs/wmt-step-time-big":
        ("small", "NUMFORMER_CACHE=wmt-cache python3 train.py --corpus wmt14-en-de --wmt-dir wmt-shaped --preset tiny "
                  "--vocab-size 2000 --max-steps 2 --eval-every 0 --no-test --no-progress --out runs/wmt-step-time-2"),
    "python3 translate.py --model runs/wmt14-en-de-base --input newstest2014.en --reference newstest2014.de "
    "--bleu paper --target-lang de":
        ("skip", "needs a model trained on WMT 2014 (tests/cli/test_paper_experiment.py runs it on a fixture)"),
    "python3 translate.py --hypotheses hyp.de --reference newstest2014.de --bleu paper --target-lang de":
        ("small", "printf 'Das Science-Fiction-Buch ist gut.\\n' > hyp.de && printf 'Das Science-Fiction-Buch ist "
                  "sehr gut.\\n' > ref.de && python3 translate.py --hypotheses hyp.de --reference ref.de --bleu paper "
                  "--target-lang de"),
    "python3 bench/recipe_sweep.py --corpus bible-en-es --minutes"
    " 10 --grid warmup=150,300,500 --out /tmp/sweep-bible-10c":
        SWEEP_POINTS,
    "python3 bench/recipe_sweep.py --corpus bible-en-es --minutes"
    " 10 --grid max-tokens=1500,2000 --out /tmp/sweep-bible-10e":
        SWEEP_POINTS,
    "python3 bench/recipe_sweep.py --corpus messages-en-es --minutes 10 --grid max-tokens=1500,3000"
    " --grid save-every-minutes=1.5 --out /tmp/sweep-msg-10":
        SWEEP_POINTS,
    "python3 bench/recipe_sweep.py --corpus bible-en-es --minutes 10 --grid max-tokens=1000,1500"
    " --grid save-every-minutes=0.6 --out /tmp/sweep-bible-10f":
        SWEEP_POINTS,
    "python3 bench/recipe_sweep.py --corpus messages-en-es --minutes 10 --grid max-tokens=1500"
    " --grid save-every-minutes=0.6 --out /tmp/sweep-msg-10g":
        SWEEP_POINTS,
    "bash bench/gpu_prepare.sh":
        ("skip", "writes .gpu_carry/ into the git checkout and reads its history: run by hand before a device call"),
    'bash bench/gpu_run.sh "$OUT"':
        ("skip", "needs a GPU (its dry run, through the same script, is tests/device/test_gpu_acceptance.py's)"),
    'bash bench/gpu_run.sh "$OUT" --parts proofs,train_step': ("skip", "needs a GPU"),
    "python3 bench/gpu_launches.py": ("run", "python3 bench/gpu_launches.py --shape quick"),  # base's: 30 s
    "python3 bench/gpu_acceptance.py OUT --device cpu --quick":
        ("run", "python3 bench/gpu_acceptance.py OUT --device cpu --quick"),
    # -- Hugging Face Marian in and out (docs/interop.md): the Hub is not reachable here -----------------------------
    "pip install -e '.[interop]'": ("skip", "bash .ci/setup installs this extra (the check runs in its tree)"),
    "python3 -m numformer.checkpoint import Helsinki-NLP/opus-mt-en-de --out opus-en-de.npz":
        ("skip", "needs the network (the Hugging Face Hub); tests/interop imports Marian models built offline"),
    "python3 translate.py --model opus-en-de.npz --input test.en --greedy":
        ("skip", "needs the opus-mt model imported from the Hub"),
    "python3 train.py --init-from opus-en-de.npz --data my_corpus/ --preset small --max-minutes 30 --lr-factor 0.1":
        ("small", "python3 train.py --init-from runs/bible-en-es-small --corpus bible-en-es --out runs/fine-tune "
                  f"--lr-factor 0.1 {SMALL_BIBLE}  # numformer's own model: the opus-mt one needs the network"),
    "python3 -m numformer.checkpoint export runs/bible-en-es-small --format ctranslate2 --out runs/bible-ct2":
        ("run", "python3 -m numformer.checkpoint export runs/bible-en-es-small --format ctranslate2 --out runs/bible-ct2"),
    "python3 -m numformer.checkpoint export runs/bible-en-es-small --format ctranslate2 --quantization int8 --out "
    "runs/bible-ct2-int8":
        ("run", "python3 -m numformer.checkpoint export runs/bible-en-es-small --format ctranslate2 --quantization "
                "int8 --out runs/bible-ct2-int8"),
    "python3 -m numformer.checkpoint export runs/bible-en-es-small --format hf --out runs/bible-en-es-small-hf":
        ("run", "python3 -m numformer.checkpoint export runs/bible-en-es-small --format hf "
                "--out runs/bible-en-es-small-hf"),
    "sacrebleu -t wmt14 -l en-de --echo src > newstest2014.en": ("skip", "needs the network (sacrebleu's test sets)"),
    "sacrebleu -t wmt14 -l en-de --echo ref > newstest2014.de": ("skip", "needs the network (sacrebleu's test sets)"),
    "python3 bench/transformers_agreement.py --model opus-en-de.npz --hf Helsinki-NLP/opus-mt-en-de --input "
    "newstest2014.en --reference newstest2014.de --sentences 0 --max-new 256":
        ("skip", "needs the opus-mt model and newstest2014 (network)"),
    "python3 translate.py --model opus-en-de.npz --input newstest2014.en --reference newstest2014.de --output "
    "numformer.de": ("skip", "needs the opus-mt model and newstest2014 (network)"),
    "python3 bench/transformers_agreement.py --model runs/bible-en-es-small --sentences 50":
        ("run", "python3 bench/transformers_agreement.py --model runs/bible-en-es-small --sentences 50"),
    "python3 bench/transformers_agreement.py --model runs/bible-en-es-small --sentences 0":
        ("small", "python3 bench/transformers_agreement.py --model runs/bible-en-es-small --sentences 8"),
}
NO_GPU_LINE = re.compile(r"error: .*(cuda|cupy|GPU)", re.I)


def shown_commands(files=DOCS) -> dict[str, list[str]]:
    """Every command of the ```bash blocks of ``files`` -> the documents that show it.

    Comments (``# ...`` to the end of a line) and blank lines are dropped; a line ending in ``\\`` goes on
    on the next; a ``for ... done`` loop is one command, shown as ``for VAR in LIST; do ... done``."""
    found: dict[str, list[str]] = {}
    for path in files:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            lines = block.replace("\\\n", " ").splitlines()
            i = 0
            while i < len(lines):
                line = _strip_comment(lines[i])
                if line.startswith("for ") and "; do" in line:
                    head = line.split("; do")[0]
                    while i < len(lines) and _strip_comment(lines[i]) != "done":
                        i += 1
                    line = f"{head}; do ... done"
                if line:
                    found.setdefault(" ".join(line.split()), []).append(path.name)
                i += 1
    return found


def _strip_comment(line: str) -> str:
    """The line without a ``#`` comment (a ``#`` inside quotes is kept)."""
    out, quote = [], None
    for ch in line:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        out.append(ch)
    return "".join(out).strip()


def make_scratch(folder: Path) -> None:
    """A folder that looks like the repository to the commands, with the example files they name."""
    for name in ("train.py", "translate.py", "bench", "tests", "grad_checks", "numformer"):
        (folder / name).symlink_to(ROOT / name)
    (folder / "docs" / "img").mkdir(parents=True)
    sys.path.insert(0, str(ROOT))
    from numformer.data import build_bible_corpus  # noqa: PLC0415

    bible = build_bible_corpus()
    for side, name in (("src", "test.en"), ("tgt", "test.es")):
        lines = (bible / f"test.{side}").read_text(encoding="utf-8").splitlines()[:20]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    for corpus in ("DIR", "wmt14-en-de"):
        (folder / corpus).mkdir()
        for split, n in (("train", 2000), ("valid", 20), ("test", 20)):
            for side in ("src", "tgt"):
                lines = (bible / f"{split}.{side}").read_text(encoding="utf-8").splitlines()[:n]
                (folder / corpus / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_all(keep: bool = False, select: str | None = None) -> int:
    shown = shown_commands()
    missing = sorted(set(shown) - set(COMMANDS))
    if missing:
        print("commands shown in the documents but not in COMMANDS:\n  " + "\n  ".join(missing))
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="numformer-docs-"))
    make_scratch(scratch)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMFORMER_DEBUG="")
    results = []
    for shown_cmd, (kind, cmd) in COMMANDS.items():
        if shown_cmd not in shown or (select and select not in shown_cmd):
            continue
        if kind == "skip":
            results.append((shown_cmd, kind, "not run: " + cmd, 0.0))
            print(f"- skip  {shown_cmd}\n        ({cmd})", flush=True)
            continue
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", cmd], cwd=scratch, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - t0
        if kind == NO_GPU:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            ok = proc.returncode == 2 and len(lines) == 1 and bool(NO_GPU_LINE.search(lines[0]))
            verdict = f"stops without a GPU: {lines[-1] if lines else ''}"
        else:
            ok = proc.returncode == 0
            verdict = "ok" if ok else f"exit {proc.returncode}"
        results.append((shown_cmd, kind, verdict if ok else "FAILED: " + verdict, seconds))
        print(f"{'+' if ok else 'X'} {kind:5s} {seconds:6.1f} s  {shown_cmd}" + ("" if cmd == shown_cmd else
              f"\n        ran: {cmd}"), flush=True)
        if not ok:
            print("        " + "\n        ".join((proc.stdout + proc.stderr).strip().splitlines()[-12:]), flush=True)
    failed = [r for r in results if r[2].startswith("FAILED")]
    ran = [r for r in results if r[1] != "skip"]
    print(f"\n{len(ran)} commands run ({sum(r[3] for r in ran) / 60:.1f} min), {len(failed)} failed, "
          f"{len(results) - len(ran)} not run (reasons above); scratch folder {scratch}")
    if not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 tests/check_docs_commands.py", description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the table and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("-k", dest="select", help="only the commands containing this text")
    args = ap.parse_args(argv)
    if args.list:
        for shown_cmd, (kind, cmd) in COMMANDS.items():
            print(f"{kind:5s} {shown_cmd}" + ("" if cmd == shown_cmd else f"\n      -> {cmd}"))
        return 0
    return run_all(args.keep, args.select)


if __name__ == "__main__":
    sys.exit(main())
