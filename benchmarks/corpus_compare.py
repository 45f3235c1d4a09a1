"""tf_mpt against Grappler's AMP pass on the model corpus (tests/support/model_corpus.py):
Casts added, nodes converted, MatMul/convolutions converted, output error, rewrite time.

    python benchmarks/corpus_compare.py [--models mobilenet_v2 resnet50 ...] [--dtype float16]

Grappler runs alone in a subprocess (tests/support/grappler_oracle.py): float16 in its CPU mode with
real float16 (the CUDA lists), bfloat16 in its oneDNN mode, which is a no-op on CPUs without
AVX512F (the row says so). Errors are relative L2 against float32 on the model's sample batch;
'input only' is the error of rounding just the input to the half type, the model's own
sensitivity. Prints a Markdown table.
"""

import argparse
import os
import sys
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests"),
                os.path.join(HERE, "..", "tests", "support"),
                os.path.join(HERE, "..", "tests", "integration")]
import grappler_oracle  # noqa: E402
import model_corpus  # noqa: E402
import test_model_corpus as corpus_checks  # noqa: E402
import tf_mpt  # noqa: E402
from tf_mpt import _cpu  # noqa: E402


REPEATS = 3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(model_corpus.BUILDERS),
                        choices=list(model_corpus.BUILDERS))
    parser.add_argument("--dtype", nargs="+", default=["float16", "bfloat16"],
                        choices=["float16", "bfloat16"])
    args = parser.parse_args(argv)
    print("; ".join(_cpu.facts()[:3]))
    print("| model | nodes | dtype | tf_mpt Casts | Grappler Casts | tf_mpt converted | "
          "Grappler converted | MatMul/conv converted (tf_mpt / Grappler / all) | "
          "error tf_mpt | error Grappler | error input only | rewrite s tf_mpt / Grappler |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for name in args.models:
        model = corpus_checks._model(name)  # pylint: disable=protected-access
        nodes = dict(grappler_oracle.all_nodes(model.graph_def))
        matrix = {n for n, node in nodes.items() if node.op in corpus_checks.MATRIX_OPS}
        for dtype in args.dtype:
            times = []
            for _ in range(REPEATS):  # the median, as Grappler's time is (first run warms up)
                start = time.perf_counter()
                ours = tf_mpt.rewrite_graph_def(model.graph_def, dtype=dtype,
                                                fetches=model.fetch_nodes, strict=True).graph_def
                times.append(time.perf_counter() - start)
            ours_s = statistics.median(times)
            converted = grappler_oracle.converted_nodes(model.graph_def, ours, dtype)
            casts = len(corpus_checks.added_casts_everywhere(ours))
            error = corpus_checks._errors(name, dtype)  # pylint: disable=protected-access
            sensitivity = corpus_checks._sensitivity(  # pylint: disable=protected-access
                name, dtype)
            theirs, info = grappler_oracle.run_grappler_amp(model.graph_def, model.fetch_nodes,
                                                            dtype, timeout=600.0,
                                                            repeats=REPEATS)
            if info["skip_reason"] is None:
                their_converted = grappler_oracle.converted_nodes(model.graph_def, theirs, dtype)
                their_error = corpus_checks._errors(  # pylint: disable=protected-access
                    name, dtype, theirs.SerializeToString())
                grappler = (f"{info['casts_added']} | {len(converted)} | {len(their_converted)} | "
                            f"{len(converted & matrix)} / {len(their_converted & matrix)} / "
                            f"{len(matrix)} | {error:.2e} | {their_error:.2e} | "
                            f"{sensitivity:.2e} | {ours_s:.2f} / {info['seconds']:.2f}")
            else:
                grappler = (f"- | {len(converted)} | - | {len(converted & matrix)} / - / "
                            f"{len(matrix)} | "
                            f"{error:.2e} | - | {sensitivity:.2e} | {ours_s:.2f} / - "
                            "(Grappler's pass is a no-op on this CPU)")
            print(f"| {name} | {len(nodes)} | {dtype} | {casts} | {grappler} |", flush=True)


if __name__ == "__main__":
    main()
