"""What window lowerings share: 1-D ops run by their 2-D lowering (`lower_1d`:
`view_4d` / `squeeze_index` see a (N, C, W) buffer as (N, C, 1, W), the same
memory), and the per-plane epilogue of the direct convolutions. The window
geometry itself is in pipeline/ops/geometry.py.
"""

from __future__ import annotations

import dataclasses

from pipeline.ops.geometry import lift_type


def view_4d(buf):
    """The same memory seen as (N, C, 1, W): a 1-D buffer for a 2-D lowering."""
    if len(buf.type.shape) != 3:
        return buf
    return dataclasses.replace(buf, type=lift_type(buf.type))


def squeeze_index(epilogue):
    """An epilogue over (N, C, W) called with 2-D lowering indices (n, c, 0, w)."""
    if epilogue is None:
        return None
    return lambda value, index: epilogue(value, [index[0], index[1], index[3]])


def lower_1d(lower):
    """The lowering of a 2-D window op, made to work on (N, C, W) tensors."""
    def lower_1d(kb, node, ins, out, epilogue):
        lower(kb, node, [view_4d(b) for b in ins], view_4d(out), squeeze_index(epilogue))

    return lower_1d


def plane_epilogue(kb, out, plane, n, oc, epilogue) -> None:
    """Apply `epilogue` to the finished (n, oc) output plane at offset `plane`."""
    if epilogue is None:
        return
    _, _, oh_n, ow_n = out.type.shape
    with kb.loop(0, oh_n, "eh") as oh, kb.loop(0, ow_n, "ew") as ow:
        o = plane + (oh * ow_n + ow)
        kb.store(out, o, epilogue(kb.load(out, o), [n, oc, oh, ow]))
