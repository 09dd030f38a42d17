"""The GPU kernels' CUDA C (numformer/kernels/cuda_sources.py) compiles in CI, on a machine with no GPU, through
NVRTC (installed by .ci/setup), for every architecture numformer targets; a syntax error fails with the compiler's
log; and a kernel whose source no GPU run has proven does not run by default (the plain math does)."""
import json

import pytest

from numformer import environment
from numformer.kernels import adam, cuda_sources
from numformer.kernels.cuda_sources import ARCHITECTURES, SOURCES, CudaCompileError, compile_ptx


import re

from numformer.kernels import registered

registered()  # imports every kernel file: each registers its CUDA C on import

KERNELS = {  # every entry point the switch's wrappers launch, by source
    "adam": {"adam_update_float32", "adam_update_float64", "squares_partials_float32", "squares_partials_float64",
             "norm_finish"},
    "dropout": {"counter_advance", "philox_stream_words", "dropout_forward_float32", "dropout_forward_float64",
                "dropout_forward_add_float32", "dropout_forward_add_float64"},
    "attention": {f"attention_softmax_{way}{masked}_{dtype}" for way in ("forward", "backward")
                  for masked in ("", "_masked") for dtype in ("float32", "float64")},
    "layernorm": {f"{k}_{dtype}" for k in ("layernorm_forward", "layernorm_backward", "column_sums")
                  for dtype in ("float32", "float64")},
    "linear": {f"{k}_{dtype}" for k in ("column_partials", "column_sums") for dtype in ("float32", "float64")},
    "loss": {f"{k}_{dtype}" for k in ("smoothed_cross_entropy", "smoothed_cross_entropy_backward")
             for dtype in ("float32", "float64")},
}


def test_every_kernel_is_registered():
    assert set(KERNELS) == set(SOURCES), "a new kernel source: list its entry points here"


def entry_points(ptx: str) -> set:
    return set(re.findall(r"\.entry (\w+)\(", ptx))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_source_compiles_without_a_gpu(name, architecture):
    """Every registered source compiles; each exports its extern "C" entry points (the listed ones at least)."""
    entries = entry_points(compile_ptx(name, architecture))
    declared = set(re.findall(r'extern "C" __global__ void (\w+)\(', SOURCES[name]))
    assert entries, f"kernel {name} exports no entry point"
    assert declared - {"NAME"} <= entries
    assert KERNELS.get(name, set()) <= entries


def test_no_multiply_add_is_contracted():
    """--fmad=false: the fused kernel rounds each product as the plain math's separate cupy kernels do."""
    assert "fma.rn" not in compile_ptx("adam")
    with_fma = cuda_sources.OPTIONS
    try:
        cuda_sources.OPTIONS = tuple(o for o in with_fma if o != "--fmad=false")
        assert "fma.rn" in compile_ptx("adam")  # the check can fail: contraction is NVRTC's default
    finally:
        cuda_sources.OPTIONS = with_fma


def test_a_syntax_error_fails_with_the_compilers_log():
    broken = SOURCES["adam"].replace("T gi = g[i];", "T gi = g[i]")
    with pytest.raises(CudaCompileError, match=r"kernel adam does not compile for compute_90.*error"):
        compile_ptx("adam", source=broken)


def test_an_unproven_source_runs_only_when_opted_in(monkeypatch, tmp_path):
    proofs = tmp_path / "cuda_proofs.json"
    monkeypatch.setattr(cuda_sources, "PROOFS", proofs)
    monkeypatch.delenv("NUMFORMER_CUDA_UNPROVEN", raising=False)
    assert not cuda_sources.proven("adam") and not cuda_sources.may_run("adam")
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    assert cuda_sources.may_run("adam")
    monkeypatch.delenv("NUMFORMER_CUDA_UNPROVEN")
    proofs.write_text(json.dumps({"adam": {"sha256": cuda_sources.source_hash("adam"), "date": "2026-11-28",
                                           "gpu": "a test", "commit": "none"}}))
    assert cuda_sources.proven("adam") and cuda_sources.may_run("adam")
    monkeypatch.setitem(SOURCES, "adam", SOURCES["adam"] + "\n// changed\n")  # a changed source is unproven again
    assert not cuda_sources.may_run("adam")


def test_the_committed_proofs_name_registered_kernels():
    for name, proof in cuda_sources.proofs().items():
        assert name in SOURCES and set(proof) == {"sha256", "date", "gpu", "commit"}


def test_host_arrays_keep_the_host_kernel():
    import numpy as np
    a = [np.zeros(4, np.float32)]
    assert adam._runs_here(a, a, a, a)


def test_a_bad_value_of_the_variable_is_refused(monkeypatch):
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "maybe")
    with pytest.raises(environment.EnvironmentVariableError, match="NUMFORMER_CUDA_UNPROVEN"):
        environment.check_all()
