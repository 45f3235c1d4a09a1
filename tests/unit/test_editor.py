"""tf_mpt/rewrite/editor.py: the one graph editor (readers index, one Cast cache, drop_unread)."""

from tensorflow.core.framework import graph_pb2

from tf_mpt import _dtypes
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite.editor import Editor
from tf_mpt.rewrite.editor import tensor_name

F32, BF16 = _dtypes.DT_FLOAT, _dtypes.DT_BFLOAT16


def _graph(*nodes):
    """nodes: (name, op, inputs[, attrs]); Casts take attrs (SrcT, DstT)."""
    graph_def = graph_pb2.GraphDef()
    for spec in nodes:
        name, op, inputs = spec[:3]
        node = graph_def.node.add(name=name, op=op, input=inputs)
        node.device = "/device:CPU:0"
        if op == "Cast":
            node.attr["SrcT"].type, node.attr["DstT"].type = spec[3]
    return graph_def


def _by_name(graph_def):
    return {n.name: n for n in graph_def.node}


def test_one_cast_per_tensor_and_dtype_named_after_its_producer_on_its_device():
    graph_def = _graph(("x", "Placeholder", []), ("mm1", "MatMul", ["x"]),
                       ("mm2", "MatMul", ["x"]), ("split", "Split", []),
                       ("split-1-CastToBf16-TfMpt", "NoOp", []))
    editor = Editor(graph_def, BF16)
    nodes = _by_name(graph_def)
    editor.set_input(nodes["mm1"], 0, editor.cast("x", BF16))
    editor.set_input(nodes["mm2"], 0, editor.cast("x", BF16))
    assert editor.cast("split:1", BF16) == "split-1-CastToBf16-1-TfMpt"  # plain name taken
    added = editor.finish()
    assert added == ["x-0-CastToBf16-TfMpt"]  # the unread split Cast went at finish
    nodes = _by_name(graph_def)
    assert nodes["mm1"].input[0] == nodes["mm2"].input[0] == "x-0-CastToBf16-TfMpt"
    cast = nodes["x-0-CastToBf16-TfMpt"]
    assert _casts.is_our_cast(cast, F32, BF16) and cast.device == "/device:CPU:0"
    assert len(graph_def.node) == 6


def test_a_cast_already_in_the_graph_is_shared_and_a_round_trip_is_undone():
    graph_def = _graph(("x", "Placeholder", []),
                       ("own", "Cast", ["x"], (F32, BF16)),
                       ("h", "Placeholder", []),
                       ("back", "Cast", ["h"], (BF16, F32)),
                       ("ordered", "Cast", ["h", "^x"], (BF16, F32)),
                       ("r", "Relu", ["x", "back", "ordered"]))
    editor = Editor(graph_def, BF16)
    assert editor.cast("x", BF16) == "own"
    assert editor.cast("back", BF16) == "h"  # half -> fp32 -> half: h itself
    # a Cast with control inputs is not undone (they order it): a new Cast of it instead
    assert editor.cast("ordered", BF16) == "ordered-0-CastToBf16-TfMpt"
    # a reusable filter excludes a Cast from sharing
    assert Editor(graph_def, BF16, reusable=lambda node: False).cast("x", BF16) != "own"


def test_set_input_keeps_the_readers_index_current():
    graph_def = _graph(("a", "Placeholder", []), ("b", "Placeholder", []),
                       ("r", "AddV2", ["a", "a"]), ("c", "NoOp", ["^a"]))
    editor = Editor(graph_def, BF16)
    r = _by_name(graph_def)["r"]
    assert [k for _, k in editor.readers("a")] == [0, 1]
    assert [n.name for n, _ in editor.readers("a", -1)] == ["c"]
    editor.set_input(r, 1, "b")
    assert [(n.name, k) for n, k in editor.readers("a")] == [("r", 0)]
    assert [(n.name, k) for n, k in editor.readers("b")] == [("r", 1)]
    assert [n.name for n in editor.all_readers("a")] == ["r", "c"]
    assert [n.name for n in editor.all_readers("b")] == ["r"]


def test_bypass_and_drop_unread_remove_only_what_nobody_reads():
    graph_def = _graph(("h", "Placeholder", []),
                       ("c1", "Cast", ["h"], (BF16, F32)),
                       ("c2", "Cast", ["h"], (BF16, F32)),
                       ("c3", "Cast", ["h"], (BF16, F32)),
                       ("r1", "Relu", ["c1"]), ("r2", "Relu", ["c2"]), ("after", "NoOp", ["^c3"]),
                       ("waits", "NoOp", ["^c1"]))
    editor = Editor(graph_def, BF16)
    editor.bypass("c1", "h")
    editor.drop_unread(["c2", "c3"])
    editor.finish()
    nodes = _by_name(graph_def)
    assert nodes["r1"].input[0] == "h" and "c1" not in nodes
    assert list(nodes["waits"].input) == ["^h"]  # a bypassed node's control readers move too
    assert "c2" in nodes  # r2 reads it
    assert "c3" in nodes  # a control reader counts as a reader


def test_read_half_bypasses_our_casts_to_half_and_casts_for_float32_readers():
    cast_to_half = "loop-1-CastToBf16-TfMpt"
    graph_def = _graph(("given", "Placeholder", []),
                       ("loop", "While", ["given", "given"]),
                       (cast_to_half, "Cast", ["loop:1"], (F32, BF16)),
                       ("mm", "MatMul", [cast_to_half]),
                       ("exp", "Exp", ["loop:1"]), ("log", "Log", ["loop:1"]))
    editor = Editor(graph_def, BF16)
    editor.read_half("loop", 1)
    added = editor.finish()
    nodes = _by_name(graph_def)
    assert nodes["mm"].input[0] == "loop:1" and cast_to_half not in nodes
    assert added == ["loop-1-CastToFp32-TfMpt"]
    assert nodes["exp"].input[0] == nodes["log"].input[0] == "loop-1-CastToFp32-TfMpt"
    # a loop invariant's float32 readers read the float32 value the loop was given
    graph_def = _graph(("given", "Placeholder", []), ("loop", "While", ["given"]),
                       ("exp", "Exp", ["loop"]))
    editor = Editor(graph_def, BF16)
    editor.read_half("loop", 0, original="given")
    assert editor.finish() == []
    assert _by_name(graph_def)["exp"].input[0] == "given"


def test_a_cast_made_redundant_is_never_handed_out_again():
    # a loop A feeds a loop B through tf_mpt's Cast to half; A goes half first
    graph_def = _graph(("a", "While", []),
                       ("a-0-CastToBf16-TfMpt", "Cast", ["a"], (F32, BF16)),
                       ("b", "While", ["a-0-CastToBf16-TfMpt"]))
    editor = Editor(graph_def, BF16)
    editor.read_half("a", 0)
    assert editor.cast("a", BF16) == "a"  # the cached Cast was replaced by a itself
    editor.finish()
    assert [n.name for n in graph_def.node] == ["a", "b"]
    assert _by_name(graph_def)["b"].input[0] == "a"


def test_tensor_names():
    assert tensor_name("n", 0) == "n" and tensor_name("n", 2) == "n:2"
    assert tensor_name("n", -1) == "^n"


def _fill_graph(value, readers=("loop",)):
    """x -> Shape -> Fill(shape, Const value) -> `readers` (While-like ops fed half)."""
    import numpy as np
    from tensorflow.python.framework import tensor_util
    graph_def = _graph(("x", "Placeholder", []), ("shape", "Shape", ["x"]),
                       ("value", "Const", []), ("zeros", "Fill", ["shape", "value"]),
                       *[(name, "While", ["zeros"]) for name in readers])
    nodes = _by_name(graph_def)
    nodes["value"].attr["dtype"].type = F32
    nodes["value"].attr["value"].tensor.CopyFrom(
        tensor_util.make_tensor_proto(np.float32(value), dtype=F32))
    nodes["zeros"].attr["T"].type = F32
    return graph_def


def _fed_half(graph_def, dtype, kept=frozenset()):
    editor = Editor(graph_def, dtype)
    for node in [n for n in graph_def.node if n.op == "While"]:
        editor.feed_half(node, 0, kept=kept)
    return editor.finish(), _by_name(graph_def)


def test_a_fill_of_a_constant_fed_half_is_made_half_instead_of_cast():
    for dtype in (BF16, _dtypes.DT_HALF):
        added, nodes = _fed_half(_fill_graph(0.0), dtype)
        assert added == [] and list(nodes["loop"].input) == ["zeros"]
        assert nodes["zeros"].attr["T"].type == nodes["value"].attr["dtype"].type == dtype
        assert nodes["value"].attr["value"].tensor.dtype == dtype


def test_a_fill_read_elsewhere_fetched_or_of_a_value_half_rounds_is_cast():
    added, nodes = _fed_half(_fill_graph(0.0, readers=("loop", "other")), BF16)
    assert added == ["zeros-0-CastToBf16-TfMpt"]  # one Cast, shared by both
    assert nodes["zeros"].attr["T"].type == F32
    added, nodes = _fed_half(_fill_graph(0.1), _dtypes.DT_HALF)  # 0.1 is not a float16
    assert added == ["zeros-0-CastToFp16-TfMpt"]
    assert nodes["zeros"].attr["T"].type == nodes["value"].attr["dtype"].type == F32
    for kept in ({"zeros"}, {"value"}):  # fetched: the script sees its dtype
        added, nodes = _fed_half(_fill_graph(0.0), BF16, kept)
        assert added == ["zeros-0-CastToBf16-TfMpt"], kept
        assert nodes["zeros"].attr["T"].type == F32
    graph_def = _fill_graph(0.0)
    _by_name(graph_def)["zeros"].attr["_tf_mpt_keep_fp32"].b = True  # opted out
    added, nodes = _fed_half(graph_def, BF16)
    assert added == ["zeros-0-CastToBf16-TfMpt"] and nodes["zeros"].attr["T"].type == F32
    # without `kept` (a caller that does not know the fetches) it is always a Cast
    editor = Editor(_fill_graph(0.0), BF16)
    editor.feed_half(_by_name(editor.graph_def)["loop"], 0)
    assert editor.finish() == ["zeros-0-CastToBf16-TfMpt"]
