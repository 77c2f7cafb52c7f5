"""mxsim._threads: small kernel calls run on one thread, and no result depends on the count."""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest

from conftest import REPO
from mxsim._threads import SERIAL_BELOW, SERIAL_GEMM_BELOW, SERIAL_QUANTIZE_BELOW, threads_for
from mxsim.datapath import dot, load_hwconfig, matmul
from mxsim.formats import get_format
from mxsim.quantize import quantize

pytestmark = pytest.mark.skipif(
    numba.config.NUMBA_NUM_THREADS < 2, reason="needs Numba's pool to hold two threads"
)


@pytest.fixture
def two_threads():
    threads = numba.get_num_threads()
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(threads)


def test_small_work_takes_one_thread_and_the_count_comes_back(two_threads):
    with threads_for(SERIAL_BELOW - 1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == 2
    with threads_for(SERIAL_BELOW):
        assert numba.get_num_threads() == 2
    with pytest.raises(ValueError), threads_for(0):
        raise ValueError("inside")
    assert numba.get_num_threads() == 2


def test_a_gemm_of_few_products_takes_one_thread(two_threads, monkeypatch):
    """The GEMM routes run a call of fewer than SERIAL_GEMM_BELOW products (MiniLM's attention
    heads: 192 x 14 x 32 x 14, a small-groups kernel's one call on the calling thread) on one
    thread, a larger one on the thread count set."""
    with threads_for(SERIAL_GEMM_BELOW - 1, SERIAL_GEMM_BELOW):
        assert numba.get_num_threads() == 1
    with threads_for(SERIAL_GEMM_BELOW, SERIAL_GEMM_BELOW):
        assert numba.get_num_threads() == 2
    from mxsim.datapath import _batch_kernels, api

    seen = []
    routes = api._gemm_routes
    callers = []
    kernel = _batch_kernels.exact_groups

    def counting(*args, **kwargs):
        seen.append(numba.get_num_threads())
        return routes(*args, **kwargs)

    def recording(*args):
        callers.append(threading.get_ident())
        return kernel(*args)

    monkeypatch.setattr(api, "_gemm_routes", counting)
    monkeypatch.setattr(_batch_kernels, "exact_groups", recording)
    hw = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
    rng = np.random.default_rng(2)
    for groups, rows in ((192, 14), (2, 1280)):  # 1.2 M products; 2 x 1280 x 32 x 1280 = 105 M
        a = rng.standard_normal((groups, rows, 32))
        b = rng.standard_normal((groups, 32, rows))
        api.matmul_batched(hw, a, b)
        if groups == 192:
            assert callers == [threading.get_ident()]  # the heads: one call, on this thread
    assert seen == [2]  # the large GEMMs: the tiled route's calls, on the thread count set


def test_a_quantization_of_few_elements_takes_one_thread(two_threads, monkeypatch):
    """MX and NVFP4 quantizations of fewer than SERIAL_QUANTIZE_BELOW elements (a layer's
    activations) run their kernel on one thread, larger ones on the thread count set."""
    from mxsim.quantize import mx, nvfp4, quantize_nvfp4

    seen = []

    def recording(real):
        def run(call, items, threads=None):
            seen.append(numba.get_num_threads())
            return real(call, items, threads)

        return run

    monkeypatch.setattr(mx, "run_in_threads", recording(mx.run_in_threads))
    monkeypatch.setattr(nvfp4, "run_in_threads", recording(nvfp4.run_in_threads))
    for size in (SERIAL_QUANTIZE_BELOW - 32, SERIAL_QUANTIZE_BELOW):
        x = np.linspace(-3.0, 3.0, size).reshape(-1, 32)
        quantize(x, "fp8_e4m3", axis=1)
        quantize_nvfp4(x.astype(np.float32))
    assert seen == [1, 1, 2, 2]


def _every_entry_point():
    """encode, decode, quantize, dequantize, dot and matmul results of work on both sides of
    SERIAL_BELOW (and quantizations past SERIAL_QUANTIZE_BELOW), for each count of threads."""
    rng = np.random.default_rng(5)
    fmt = get_format("fp8_e4m3")
    results = []
    for size in (64, 4 * SERIAL_BELOW, 2 * SERIAL_QUANTIZE_BELOW):
        x = rng.standard_normal(size) * np.exp(rng.normal(0, 4, size))
        codes = fmt.encode(x)
        tensor = quantize(x.reshape(-1, 32), "fp8_e4m3", axis=1)
        results += [codes, fmt.decode(codes), tensor.codes, tensor.dequantize()]
    for name in ("ocp-exact", "h100-fp8", "mxdotp"):
        hw = load_hwconfig(REPO / "hwconfigs" / f"{name}.yaml")
        for rows, k in ((3, 32), (96, 512)):
            a = rng.standard_normal((rows, k))
            b = rng.standard_normal((rows, k))
            qa = quantize(a, "fp8_e4m3", axis=1)
            qb = quantize(b, "fp8_e4m3", axis=1)
            scaled = hw.params("fp8_e4m3", "fp8_e4m3").scales != "none"
            results.append(
                dot(
                    hw,
                    qa.codes,
                    qb.codes,
                    a_format="fp8_e4m3",
                    b_format="fp8_e4m3",
                    scale_a=qa.scales if scaled else None,
                    scale_b=qb.scales if scaled else None,
                )
            )
            product = matmul(
                hw,
                a,
                b.T,
                a_format="fp8_e4m3",
                b_format="fp8_e4m3",
                per_tensor_scale=not scaled,
            )
            results.append(product.bits)
    return results


def test_results_do_not_depend_on_the_thread_count(two_threads):
    on_two = _every_entry_point()
    numba.set_num_threads(1)
    on_one = _every_entry_point()
    assert len(on_two) == len(on_one)
    for got, want in zip(on_two, on_one):
        np.testing.assert_array_equal(got, want)


@pytest.fixture
def flushing_mode(torch):
    """A setter of this thread's flush-to-zero / denormals-are-zero mode (torch's), which the
    test leaves off."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode that torch sets")
    yield torch.set_flush_denormal
    torch.set_flush_denormal(False)


def test_pool_threads_keep_subnormals_when_the_caller_does(two_threads, flushing_mode):
    """A pool started while the caller flushed subnormals is not used once the caller keeps
    them: its threads inherited the flushing mode, and the exact small-groups route, which
    the caller's mode admits, would flush the fp32 subnormal outputs it computes there."""
    from mxsim import _threads
    from mxsim.datapath import matmul_batched

    seen = []

    def record(start, stop):
        seen.append(_threads.subnormals_work())

    kept_pools = dict(_threads._pools)
    try:
        _threads._pools.clear()
        flushing_mode(True)
        _threads.run_in_threads(record, 8)  # the pool starts its threads in flushing mode
        assert seen and not any(seen)
        flushing_mode(False)
        seen.clear()
        _threads.run_in_threads(record, 8)
        assert seen and all(seen)

        unit = load_hwconfig(REPO / "hwconfigs" / "ocp-exact.yaml")
        rng = np.random.default_rng(0)
        # 768 heads of 14 x 32 x 14: above SERIAL_GEMM_BELOW, so the kernel runs on the pool
        a = rng.standard_normal((768, 14, 32)) * 2.0**-70
        b = rng.standard_normal((768, 32, 14)) * 2.0**-70
        formats = {"a_format": "fp8_e4m3", "b_format": "fp8_e4m3"}
        want = matmul_batched(unit, a, b, method="kernel", **formats).bits
        flushing_mode(True)
        _threads.run_in_threads(record, 8)
        flushing_mode(False)
        got = matmul_batched(unit, a, b, **formats).bits
        assert ((want & 0x7F800000) == 0).mean() > 0.9  # fp32 subnormal outputs
        assert np.array_equal(got, want)
    finally:
        _threads._pools.clear()
        _threads._pools.update(kept_pools)


def test_callers_alternating_float_modes_each_keep_their_pool(two_threads, flushing_mode):
    """A call in the flushing mode starts a pool of its own and leaves the other mode's kept
    pool in place, so callers that alternate modes do not start threads on every call."""
    from mxsim import _threads

    flushing_mode(False)  # (the fixture leaves it on)
    keeping = _threads.kept_pool(2)
    flushing_mode(True)
    flushing = _threads.kept_pool(2)
    flushing_mode(False)
    assert _threads.kept_pool(2) is keeping
    flushing_mode(True)
    assert _threads.kept_pool(2) is flushing and flushing is not keeping


def test_work_run_from_inside_the_kept_pool_runs_there_without_waiting_on_it(tmp_path):
    """run_in_threads called by a task of the kept pool (every one of its threads busy
    with such tasks) runs its chunks on that thread: it never waits for the pool's other
    threads, which may all be waiting likewise (a deadlock). In a child process, as a
    deadlock would never end."""
    import subprocess
    import sys

    script = (
        "import numba, numpy as np\n"
        "from mxsim import _threads\n"
        "from mxsim.datapath import load_hwconfig, matmul_batched\n"
        "numba.set_num_threads(2)\n"
        "pool = _threads.kept_pool(2)\n"
        "seen = []\n"
        "def task(_):\n"
        "    _threads.run_in_threads(lambda a, b: seen.append((a, b)), 8)\n"
        "    return 1\n"
        "assert sum(pool.map(task, range(4))) == 4\n"
        "assert seen == [(0, 8)] * 4  # all on the task's own thread\n"
        "unit = load_hwconfig('hwconfigs/ocp-exact.yaml')\n"
        "rng = np.random.default_rng(0)\n"
        "a, b = rng.standard_normal((2, 8, 128, 64)), rng.standard_normal((2, 8, 64, 128))\n"
        "def heads(i):\n"  # the BLAS route's tiles, from a pool thread
        "    return matmul_batched(unit, a[i], b[i], a_format='fp8_e4m3', b_format='fp8_e4m3')\n"
        "got = list(pool.map(heads, range(2)))\n"
        "for i in range(2):\n"
        "    want = matmul_batched(unit, a[i], b[i], a_format='fp8_e4m3', b_format='fp8_e4m3',\n"
        "                          method='kernel')\n"
        "    assert np.array_equal(got[i].bits, want.bits)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_kept_pool_runs_no_more_threads_than_asked(two_threads):
    """After a larger pool was asked for, run_in_threads on two threads runs at most two
    chunks at once (the thread count it was given), not the larger pool's count."""
    import time

    from mxsim import _threads

    _threads.kept_pool(4)
    lock, running, most = threading.Lock(), [0], [0]

    def chunk(start, stop):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    _threads.run_in_threads(chunk, 8)
    assert most[0] == 2


def test_a_call_of_fewer_items_than_threads_keeps_the_pool(two_threads, monkeypatch):
    """run_in_threads of fewer items than the thread count runs them on the pool of the
    full count (as many chunks as items: no more at once), not a pool of its own that the
    next call of more items would replace again."""
    from mxsim import _threads

    monkeypatch.setattr(numba, "get_num_threads", lambda: 3)  # (a count this machine lacks)
    _threads.run_in_threads(lambda start, stop: None, 9)
    pool = _threads._pools[True]
    _threads.run_in_threads(lambda start, stop: None, 2)
    assert _threads._pools[True] is pool and pool[1] == 3


def test_subnormals_work_follows_the_threads_flushing_mode(flushing_mode):
    from mxsim import _threads

    flushing_mode(False)  # (the fixture leaves the mode on)
    assert _threads.subnormals_work()
    flushing_mode(True)
    try:
        flushing = _threads.subnormals_work()
        # numpy's float32 conversion and product see the same mode (the former check)
        tiny = np.float32(np.float64(1e-40))
        numpy_flushes = tiny == 0.0 or tiny * np.float32(1.0) == 0.0
    finally:
        flushing_mode(False)
    assert not flushing and numpy_flushes
    assert _threads.subnormals_work()
