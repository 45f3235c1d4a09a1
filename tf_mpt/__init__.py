"""tf_mpt: automatic mixed precision for TensorFlow graphs by graph rewriting.

Public API:
    rewrite_graph_def(graph_def, *, dtype, fetches, lists, strict) -> RewriteResult
    rewrite_graph(graph, *, dtype, fetches) -> tf.Graph
    keep_fp32(name=None): context manager; ops built inside stay float32
    OpLists, default_lists, FLOAT16_LISTS, BFLOAT16_LISTS: the op lists, as data
    Config: every TF_MPT_* environment variable, parsed once
    RewriteReport, NodeDecision, RewriteResult, RewriteError, GraphDefError
"""

from tf_mpt.config import Config
from tf_mpt.lists import BFLOAT16_LISTS
from tf_mpt.lists import FLOAT16_LISTS
from tf_mpt.lists import OpLists
from tf_mpt.lists import default_lists
from tf_mpt.report import NodeDecision
from tf_mpt.report import RewriteReport
from tf_mpt.rewrite import GraphDefError
from tf_mpt.rewrite import RewriteError
from tf_mpt.rewrite import RewriteResult
from tf_mpt.rewrite import keep_fp32
from tf_mpt.rewrite import rewrite_graph
from tf_mpt.rewrite import rewrite_graph_def

__version__ = "0.1.0"

__all__ = [
    "BFLOAT16_LISTS",
    "Config",
    "FLOAT16_LISTS",
    "GraphDefError",
    "NodeDecision",
    "OpLists",
    "RewriteError",
    "RewriteReport",
    "RewriteResult",
    "default_lists",
    "keep_fp32",
    "rewrite_graph",
    "rewrite_graph_def",
]
