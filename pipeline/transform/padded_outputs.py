"""write_padded_outputs (AlterOpLayout's last step): an int8 blocked convolution whose
only reader is the qpad_nchwc before the next convolution writes its output straight
into that pad's layout, and the pad goes.

The convolution (qconv2d_nchwc, or qdepthwise_conv2d_nchwc without the DSP kernels)
takes the pad's borders as attr out_pads (top, left, bottom, right) and its fill value
(the next convolution's input zero point) as out_fill: its output tensor is the
padded one, the values at their padded place, and each work item (an output row)
also writes its row's left and right border pixels, the first row the rows above it
and the last the rows below (kernels/qconv_blocked.py fill_borders). A pad was a copy
of every byte with 2-3 us of work per call; at two threads each took 2-4x its
one-thread time (fork and join, rows from the other core), about 0.18 ms of
mobilenet_v2_qop's 1.57.

Only where the pad copies the convolution's tensor as it is: the same channel block,
no channels added, no `window` (M-profile single-channel input), the tensor no graph
output and read by nothing else (a residual block's sum, read twice, keeps its pad).
"""

from __future__ import annotations

from pipeline.ir.graph import Graph, Node
from pipeline.transform.util import sole_user

_WRITERS = ("qconv2d_nchwc", "qdepthwise_conv2d_nchwc")


def _absorbs(conv: Node | None, pad: Node, shape: tuple) -> bool:
    """Whether `conv` can write `pad`'s output (module doc); shape: conv's output's."""
    if conv is None or conv.op not in _WRITERS or conv.attr("out_pads") \
            or conv.attr("dot") in ("smlad", "mve") or pad.attr("window"):
        return False
    _, blocks, _, _, block = shape
    return pad.attr("block") == block and pad.attr("channels") == blocks * block


def write_padded_outputs(graph: Graph) -> Graph:
    """`graph` with each qpad_nchwc that a convolution can write (module doc) folded
    into that convolution."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    writes, dropped = {}, set()
    for pad in graph.nodes:
        if pad.op != "qpad_nchwc" or sole_user(consumers, outputs, pad.inputs[0]) is not pad:
            continue
        conv = producer.get(pad.inputs[0])
        if not _absorbs(conv, pad, graph.types[pad.inputs[0]].shape):
            continue
        writes[conv.name] = Node.make(conv.op, conv.name, conv.inputs, pad.outputs,
                                      **dict(conv.attrs), out_fill=pad.attr("fill"),
                                      out_pads=tuple(pad.attr("pads")))
        dropped.add(pad.name)
    if not writes:
        return graph
    nodes = tuple(writes.get(n.name, n) for n in graph.nodes if n.name not in dropped)
    return graph.replace(nodes=nodes)
