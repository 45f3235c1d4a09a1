"""Measures the constants of tf_mpt's cost model (tf_mpt/rewrite/paint/cost.py) on this machine.

Chains of 40 ops in one Session.run amortise the call overhead; each figure is the median of
rounds. Printed: per-op time of MatMul in float32 and in the half type at several sizes (from
which the fixed cost per op and the FLOP rates are fitted), and Cast float32 <-> half per
element and per op. Usage: python benchmarks/calibrate_cost_model.py [--dtype bfloat16]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

CHAIN = 40


def matmul_chain(n, dtype):
    """Seconds per MatMul of [n, n] x [n, n] in a chain (inputs already of `dtype`)."""
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.default_rng(0)
        h = tf.Variable(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n))
        w = tf.Variable(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n))
        h, w = tf.cast(h, dtype), tf.cast(w, dtype)
        base = tf.identity(h)
        for _ in range(CHAIN):
            h = tf.matmul(h, w)
        init = tf.compat.v1.global_variables_initializer()
    # Subtract the chain's start (variable reads and the two casts).
    graph_start = _time(graph, init, base)
    total = _time(graph, init, h)
    return (total - graph_start) / CHAIN


def _time(graph, init, fetch, rounds=7, runs=10):
    """Median seconds per Session.run of `fetch` (variables initialised, 3 warm-up runs)."""
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(3):
            session.run(fetch)
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(runs):
                session.run(fetch)
            samples.append((time.perf_counter() - start) / runs)
    return statistics.median(samples)


def cast_chain(elements, dtype):
    """Seconds per Cast of `elements` values (half the casts to `dtype`, half back)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.Variable(np.ones(elements, np.float32))
        init = tf.compat.v1.global_variables_initializer()
        h = tf.identity(x)
        base = h
        for _ in range(CHAIN // 2):
            h = tf.cast(tf.cast(h, dtype), tf.float32)
    return (_time(graph, init, h) - _time(graph, init, base)) / CHAIN


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    dtype = tf.as_dtype(parser.parse_args().dtype)
    print(f"MatMul [n,n]x[n,n] per op (chain of {CHAIN}), float32 vs {dtype.name}:")
    rows = []
    for n in (8, 32, 64, 128, 256, 512, 1024):
        t32, t16 = matmul_chain(n, tf.float32), matmul_chain(n, dtype)
        flops = 2 * n ** 3
        rows.append((flops, t32, t16))
        print(f"  n={n:5d} flops={flops:12.0f} float32 {t32 * 1e6:9.2f} us ({flops / t32 / 1e9:7.1f}"
              f" GFLOP/s)  {dtype.name} {t16 * 1e6:9.2f} us ({flops / t16 / 1e9:7.1f} GFLOP/s)"
              f"  speed-up {t32 / t16:5.2f}")
    print(f"Cast float32 <-> {dtype.name} per op:")
    for elements in (16, 1024, 65536, 1 << 20):
        t = cast_chain(elements, dtype)
        print(f"  {elements:8d} elements {t * 1e6:9.2f} us ({t / elements * 1e9:7.3f} ns/element)")


if __name__ == "__main__":
    main()
