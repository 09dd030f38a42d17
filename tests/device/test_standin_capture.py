"""The CuPy stand-in's stream capture (tests/cupy_standin.py), the model the step graphs' rehearsal trusts: each
thing CuPy 14 refuses while a stream captures is refused with CuPy's own exception and message (cupy/cupy:
cupy_backends/cuda/libs/cublas.pyx and curand.pyx setStream, tests/cupy_tests/cuda_tests/test_graph.py's
failure cases), the two hazards CuPy lets through are refused with the stand-in's, a graph replays its records on
the same memory with the capture's host values baked in, and computing a capture leaves nothing written."""
import numpy as np
import pytest

pytest.importorskip("cupy")

from cupy_backends.cuda.api.runtime import CUDARuntimeError  # noqa: E402

SYNC = "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"


@pytest.fixture
def xp(monkeypatch):
    import cupy_standin as cs  # noqa: PLC0415

    return cs.install(monkeypatch)


def captured(xp, body, pool=True):
    """Run ``body(a)`` under a capture (a: a device array of 4 floats); -> (graph or the error end_capture raised,
    what body raised)."""
    a = xp.asarray(np.arange(4, dtype=np.float32))
    stream = xp.cuda.Stream(non_blocking=True)
    allocator = xp.cuda.MemoryPool().malloc if pool else None
    raised = None
    with xp.cuda.using_allocator(allocator), stream:
        stream.begin_capture()
        try:
            body(a)
        except Exception as exc:  # noqa: BLE001
            raised = exc
        try:
            graph = stream.end_capture()
        except CUDARuntimeError as exc:
            graph = exc
    return graph, raised


@pytest.mark.parametrize("what, body, error, message, invalidates", [
    ("@", lambda xp, a: a.reshape(2, 2) @ a.reshape(2, 2), NotImplementedError,
     "calling cuBLAS API during stream capture is currently unsupported", False),
    ("matmul", lambda xp, a: xp.matmul(a.reshape(2, 2), a.reshape(2, 2)), NotImplementedError, "cuBLAS", False),
    ("dot", lambda xp, a: xp.dot(a, a), NotImplementedError, "cuBLAS", False),
    ("einsum", lambda xp, a: xp.einsum("i,i->", a, a), NotImplementedError, "cuBLAS", False),
    ("cuRAND", lambda xp, a: xp.random.random(4), NotImplementedError,
     "calling cuRAND API during stream capture is currently unsupported", False),
    ("float", lambda xp, a: float(a.sum()), CUDARuntimeError, SYNC, True),
    ("bool", lambda xp, a: bool(a[0] > 0), CUDARuntimeError, SYNC, True),
    (".get", lambda xp, a: a.get(), CUDARuntimeError, SYNC, True),
    ("synchronize", lambda xp, a: xp.cuda.get_current_stream().synchronize(), CUDARuntimeError, SYNC, True),
    ("where with one argument", lambda xp, a: xp.where(a > 1), CUDARuntimeError, SYNC, True),
    ("a boolean mask", lambda xp, a: a[a > 1], CUDARuntimeError, SYNC, True),
    ("an upload", lambda xp, a: xp.asarray(np.ones(3)), RuntimeError, "host-to-device upload", False),
])
def test_what_cupy_refuses_under_a_capture_is_refused_with_its_message(xp, what, body, error, message, invalidates):
    graph, raised = captured(xp, lambda a: body(xp, a))
    assert type(raised) is error and message in str(raised), (what, raised)
    if invalidates:  # CUDA invalidated the capture: end_capture says so, as in CuPy's test_stream_capture_failure1
        assert isinstance(graph, CUDARuntimeError) and "cudaErrorStreamCaptureInvalidated" in str(graph)
    else:
        assert not isinstance(graph, Exception)


def test_the_same_operations_outside_a_capture_are_allowed(xp):
    a = xp.asarray(np.arange(4, dtype=np.float32))
    assert float(a.sum()) == 6 and (a.reshape(2, 2) @ a.reshape(2, 2)).shape == (2, 2)
    assert xp.where(a > 1)[0].shape == (2,) and xp.random.random(2).shape == (2,)


def test_an_allocation_outside_the_capture_s_pool_is_refused(xp):
    graph, raised = captured(xp, lambda a: a + 1, pool=False)
    assert isinstance(raised, RuntimeError) and "default memory pool" in str(raised)


def test_a_graph_replays_on_the_same_memory_and_the_capture_ran_nothing(xp):
    """a += 1.5; b = 2 a, captured: the capture leaves a as it was (a GPU's capture runs none of its work), each
    replay reads a's new values and writes the same b (the host number 1.5 baked in: tests/training/
    test_step_graphs.py plants a host token count and sees it baked)."""
    a = xp.asarray(np.zeros(2, dtype=np.float32))
    stream = xp.cuda.Stream(non_blocking=True)
    with xp.cuda.using_allocator(xp.cuda.MemoryPool().malloc), stream:
        stream.begin_capture()
        a += 1.5
        b = a * 2
        graph = stream.end_capture()
    np.testing.assert_array_equal(np.asarray(a).view(np.ndarray), [0, 0])  # the capture ran nothing
    graph.launch()
    graph.launch()
    np.testing.assert_array_equal(np.asarray(a).view(np.ndarray), [3, 3])
    np.testing.assert_array_equal(np.asarray(b).view(np.ndarray), [6, 6])


def test_free_all_blocks_refuses_while_a_graph_of_the_pool_lives(xp):
    stream, pool = xp.cuda.Stream(non_blocking=True), xp.cuda.MemoryPool()
    a = xp.asarray(np.zeros(2, dtype=np.float32))
    with xp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        a + 1
        graph = stream.end_capture()
    assert pool.total_bytes() > 0
    with pytest.raises(AssertionError, match="live CUDA graph"):
        pool.free_all_blocks()
    del graph
    pool.free_all_blocks()
    assert pool.total_bytes() == 0


def test_bench_gpu_launches_counts_a_tiny_step():
    """bench/gpu_launches.py (the launch counts docs/gpu.md reports) on tiny shapes: the eager step with the fused
    kernels, and the captured body on numformer's handle (no CuPy GEMM left in it)."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "bench/gpu_launches.py", "--shape", "quick", "--json"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    eager, body = res["eager"], res["graph body"]
    assert eager["total"] > 100 and body["total"] > 100
    assert eager["by_kind"]["fused kernels"] == body["by_kind"]["fused kernels"] > 0
    assert "CuPy matmul and its copies" not in body["by_kind"] and body["by_kind"]["cuBLAS (numformer's handle)"] > 0
