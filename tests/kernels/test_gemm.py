"""numformer's own cuBLAS handle (numformer/kernels/gemm.py) on the CuPy stand-in, which answers its cuBLAS calls
column-major on host memory as cuBLAS defines them (tests/cupy_standin.py StandinCublas): the handle's argument
arithmetic (transposes, leading dimensions, batch strides, the operands it must copy) gives ``@`` bit for bit, and
under a capture it is accepted only bound to the capturing stream with its own workspace. On a GPU, the same calls
on the real cuBLAS: tests/device/test_gemm_on_gpu.py."""
import numpy as np
import pytest

from numformer import backend
from numformer.kernels import gemm

pytest.importorskip("cupy")


@pytest.fixture
def standin(monkeypatch):
    import cupy_standin as cs  # noqa: PLC0415

    xp = cs.install(monkeypatch)
    return xp, cs


def device(xp, a):
    return xp.asarray(np.ascontiguousarray(a))


def cases(rng):
    """(name, a, b): the products a training step makes, as views of the layouts it makes them in."""
    x = rng.standard_normal((24, 16)).astype(np.float32)
    w = rng.standard_normal((16, 12)).astype(np.float32)
    dy = rng.standard_normal((24, 12)).astype(np.float32)
    heads = rng.standard_normal((3, 5, 2 * 4)).astype(np.float32).reshape(3, 5, 2, 4).transpose(0, 2, 1, 3)
    keys = rng.standard_normal((3, 7, 2 * 4)).astype(np.float32).reshape(3, 7, 2, 4).transpose(0, 2, 1, 3)
    p = rng.standard_normal((3, 2, 5, 7)).astype(np.float32)
    return [
        ("x W", lambda xp: (device(xp, x), device(xp, w))),
        ("dy W^T", lambda xp: (device(xp, dy), device(xp, w).T)),
        ("x^T dy", lambda xp: (device(xp, x).T, device(xp, dy))),
        ("a row", lambda xp: (device(xp, x[:1]), device(xp, w))),
        ("a column", lambda xp: (device(xp, x), device(xp, w[:, :1]))),
        ("a strided slice", lambda xp: (device(xp, x)[::2], device(xp, w))),
        ("Q K^T on head views", lambda xp: (device(xp, heads.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
                                            device(xp, keys.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
                                            .swapaxes(-1, -2))),
        ("P V, contiguous P", lambda xp: (device(xp, p), device(xp, keys.transpose(0, 2, 1, 3))
                                          .transpose(0, 2, 1, 3))),
        ("P^T dO", lambda xp: (device(xp, p).swapaxes(-1, -2), device(xp, heads))),
        ("a broadcast weight", lambda xp: (device(xp, p), device(xp, rng.standard_normal((7, 3))
                                                                  .astype(np.float32)))),
        ("float64", lambda xp: (device(xp, x.astype(np.float64)), device(xp, w.astype(np.float64)).T.T)),
    ]


@pytest.mark.parametrize("case", range(11))
def test_the_handle_computes_at_bit_for_bit(standin, case):
    xp, cs = standin
    name, make = cases(np.random.default_rng(0))[case]
    a, b = make(xp)
    handle = gemm.Handle(xp)
    handle.bind(0)
    got = handle.matmul(a, b)
    want = np.asarray(a).view(np.ndarray) @ np.asarray(b).view(np.ndarray)
    assert type(got) is xp.ndarray and got.flags.c_contiguous and got.shape == want.shape, name
    np.testing.assert_array_equal(np.asarray(got).view(np.ndarray), want, err_msg=name)


def test_float16_products_are_the_fp16_mode_s(standin):
    """float16 operands, float32 sums, a float16 result: what numformer.precision emulates on the CPU."""
    xp, cs = standin
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((9, 33), (33, 5)))
    handle = gemm.Handle(xp)
    handle.bind(0)
    got = handle.matmul(device(xp, a), device(xp, b).T.T)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(np.asarray(got).view(np.ndarray), want)


def test_only_head_views_are_copied(standin):
    """A transposed matrix is a transpose flag and a contiguous or broadcast batch one stride: no copy; the head
    views of multi-head attention (two batch strides) are copied first, one copy each."""
    xp, cs = standin
    rng = np.random.default_rng(2)
    handle = gemm.Handle(xp)
    handle.bind(0)
    for name, make in cases(rng):
        a, b = make(xp)
        cs.reset_counts()
        handle.matmul(a, b)
        copies = cs.LAUNCHES.get("ascontiguousarray", 0)
        gemms = sum(v for k, v in cs.LAUNCHES.items() if k.startswith("cublas"))
        expected = {"Q K^T on head views": 2, "P V, contiguous P": 1}  # a slice's rows: an ld; dO here contiguous
        assert gemms == 1 and copies == expected.get(name, 0), (name, dict(cs.LAUNCHES))


def test_owned_gemms_route_device_products_and_leave_host_ones_to_at(standin):
    xp, cs = standin
    handle = gemm.Handle(xp)
    handle.bind(0)
    a = np.ones((2, 3), dtype=np.float32)
    with gemm.owned_gemms(handle):
        cs.reset_counts()
        backend.matmul(device(xp, a), device(xp, a).T)
        assert cs.LAUNCHES["cublas cublasGemmEx"] == 1 and "matmul" not in cs.LAUNCHES
        assert type(backend.product(a, a.T)) is np.ndarray  # host arrays: @
    cs.reset_counts()
    backend.matmul(device(xp, a), device(xp, a).T)
    assert cs.LAUNCHES["matmul"] == 1 and not any(k.startswith("cublas") for k in cs.LAUNCHES)


@pytest.mark.parametrize("planted", [None, "another stream", "no workspace", "cupy's @"])
def test_under_a_capture_only_a_handle_bound_to_the_capturing_stream_is_accepted(standin, planted):
    """The handle is bound (stream, then its own workspace) before the capture begins: its GEMMs are recorded and
    replay with the operands' new values. Bound to another stream, or with cuBLAS's default workspace, or CuPy's
    ``@``: refused (the check can fail)."""
    xp, cs = standin
    a, b = device(xp, np.eye(3, dtype=np.float32)), device(xp, np.arange(9, dtype=np.float32).reshape(3, 3))
    handle = gemm.Handle(xp)
    stream = xp.cuda.Stream(non_blocking=True)
    pool = xp.cuda.MemoryPool()
    handle.bind(xp.cuda.Stream(non_blocking=True).ptr if planted == "another stream" else stream.ptr)
    if planted == "no workspace":
        handle.library.handles[handle.handle]["workspace"] = None
    with xp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            if planted == "cupy's @":
                with pytest.raises(NotImplementedError, match="calling cuBLAS API during stream capture is currently "
                                                              "unsupported"):
                    a @ b
                return
            if planted is not None:
                with pytest.raises(AssertionError, match="outside the graph|workspace"):
                    handle.matmul(a, b)
                return
            c = handle.matmul(a, b)
        finally:
            graph = stream.end_capture()
    a[...] = 2 * np.eye(3, dtype=np.float32)
    graph.launch(stream=stream)
    np.testing.assert_array_equal(np.asarray(c).view(np.ndarray), 2 * np.arange(9, dtype=np.float32).reshape(3, 3))


@pytest.mark.parametrize("planted", ["transpose flag", "leading dimension"])
def test_a_planted_argument_bug_is_caught(standin, monkeypatch, planted):
    """The check can fail: a transposed view passed without its flag, or a row-major leading dimension taken from
    the wrong stride, gives another product than ``@``."""
    xp, cs = standin
    real = gemm._matrix

    def wrong(a):
        op, ld = real(a)
        if planted == "transpose flag":
            return gemm.OP_N, ld
        return op, a.shape[-1] if op == gemm.OP_N else ld
    monkeypatch.setattr(gemm, "_matrix", wrong)
    rng = np.random.default_rng(3)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((6, 8), (5, 8)))
    a, b = (device(xp, x)[:, :4], device(xp, w)[:, :4].T) if planted == "leading dimension" else \
        (device(xp, x), device(xp, w).T)
    handle = gemm.Handle(xp)
    handle.bind(0)
    got = np.asarray(handle.matmul(a, b)).view(np.ndarray)
    assert not np.array_equal(got, np.asarray(a).view(np.ndarray) @ np.asarray(b).view(np.ndarray))
