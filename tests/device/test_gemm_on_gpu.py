"""On a GPU (``pytest -m gpu``): numformer's own cuBLAS handle (numformer/kernels/gemm.py, ctypes on the libcublas
CuPy loaded) against CuPy's ``@``: the same cuBLAS call gives the same bits (2-D float32 and float64 products,
transposed views as flags, contiguous batches), the copies of head views the same values within the GEMM's
rounding, TF32 within its rounding; a product captured in a CUDA graph on a stream the handle was bound to before
the capture replays with the operands' new values, where CuPy's ``@`` is refused. The argument arithmetic is
tested without a GPU on the CuPy stand-in: tests/kernels/test_gemm.py."""
import numpy as np
import pytest

from numformer.kernels import gemm

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy  # noqa: PLC0415

    return cupy


@pytest.fixture(scope="module")
def handle(cp):
    h = gemm.Handle(cp)
    yield h
    h.close()


def rand(cp, shape, dtype=np.float32, seed=0):
    return cp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_dimensional_products_equal_at_bit_for_bit(cp, handle, dtype):
    """Base's Linear GEMMs (25,000 rows, 512 -> 2048) and their backward: x W, dy W^T, x^T dy."""
    handle.bind(cp.cuda.get_current_stream().ptr)
    x, w, dy = rand(cp, (25000, 512), dtype), rand(cp, (512, 2048), dtype, 1), rand(cp, (25000, 2048), dtype, 2)
    for a, b in ((x, w), (dy, w.T), (x.T, dy)):
        np.testing.assert_array_equal(cp.asnumpy(handle.matmul(a, b)), cp.asnumpy(a @ b))


def test_batched_products_equal_at(cp, handle):
    """Attention's products at base's shape (625 x 8 heads x 40 x 64): contiguous batches bit for bit, head views
    (copied by both) within float32 GEMM rounding."""
    handle.bind(cp.cuda.get_current_stream().ptr)
    p, v = rand(cp, (625, 8, 40, 40)), rand(cp, (625, 8, 40, 64), seed=1)
    np.testing.assert_array_equal(cp.asnumpy(handle.matmul(p, v)), cp.asnumpy(p @ v))
    q = rand(cp, (625, 40, 512), seed=2).reshape(625, 40, 8, 64).transpose(0, 2, 1, 3)
    k = rand(cp, (625, 40, 512), seed=3).reshape(625, 40, 8, 64).transpose(0, 2, 1, 3)
    got, want = cp.asnumpy(handle.matmul(q, k.swapaxes(-1, -2))), cp.asnumpy(q @ k.swapaxes(-1, -2))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_tf32_and_fp16_products_are_within_their_rounding(cp, handle):
    handle.bind(cp.cuda.get_current_stream().ptr)
    a, b = rand(cp, (4096, 512)), rand(cp, (512, 1024), seed=1)
    exact = cp.asnumpy(a.astype(cp.float64) @ b.astype(cp.float64))
    tf32 = cp.asnumpy(handle.matmul(a, b, tf32=True))
    assert np.linalg.norm(tf32 - exact) <= 2e-3 * np.linalg.norm(exact)
    half = cp.asnumpy(handle.matmul(a.astype(cp.float16), b.astype(cp.float16)).astype(cp.float32))
    assert np.linalg.norm(half - exact) <= 5e-3 * np.linalg.norm(exact)


def test_a_captured_product_replays_with_new_operands(cp, handle):
    a, b = rand(cp, (256, 128)), rand(cp, (128, 64), seed=1)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:
        with pytest.raises(NotImplementedError, match="cuBLAS"):  # CuPy's own @, as its test_graph.py asserts
            stream.begin_capture()
            try:
                a @ b
            finally:
                stream.end_capture()
        handle.bind(stream.ptr)
        stream.begin_capture()
        c = handle.matmul(a, b)
        graph = stream.end_capture()
    a[...] = rand(cp, (256, 128), seed=5)
    graph.launch(stream=stream)
    stream.synchronize()
    handle.bind(cp.cuda.get_current_stream().ptr)
    np.testing.assert_array_equal(cp.asnumpy(c), cp.asnumpy(handle.matmul(a, b)))
