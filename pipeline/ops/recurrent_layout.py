"""The packed weight layout of the recurrent kernel, shared by the LSTM/GRU/RNN
converters (which pack the weights) and pipeline/kernels/recurrent_kernel.py."""

from __future__ import annotations

LANES = 8
BLOCK = 2 * LANES  # columns of one packed block (two vectors)


def padded(width: int) -> int:
    return -(-width // BLOCK) * BLOCK


def group_widths(cell: str, hidden: int) -> tuple[int, ...]:
    """The column groups of Rᵀ a step multiplies separately (GRU's h gate needs r·h first)."""
    return {"lstm": (4 * hidden,), "gru": (2 * hidden, hidden), "rnn": (hidden,)}[cell]
