"""Writes torch_gpt_block.onnx beside this file: two small GPT-style decoder blocks
exported by PyTorch's own ONNX exporter, unfused, as a user's model arrives: LayerNorm
(decomposed at opset 16), RMSNorm written out (x * rsqrt(mean(x^2) + eps) * w), rotary
embedding (rotate_half), causal attention through matmul + softmax (an additive mask in
one block, masked_fill in the other) and through F.scaled_dot_product_attention, GELU
in its erf and tanh forms. tests/unit/test_transform_llm.py checks that it compiles to
the fused kernels and matches onnxruntime. Needs torch (pip install torch==2.13.0, CPU);
the committed .onnx is what the tests use, so neither the product nor the tests need
torch.

    python tests/tools/data/make_torch_gpt_block.py
"""

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, SEQ = 16, 2, 8


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, llama: bool) -> None:
        super().__init__()
        self.llama = llama
        self.norm1 = nn.LayerNorm(D)
        self.norm2_w = nn.Parameter(torch.rand(D) + 0.5)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        hd = D // HEADS
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(SEQ).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("causal", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)))

    def rms(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm2_w

    def attend(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in (q, k, v))
        if self.llama:
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
            a = q @ k.transpose(-2, -1) / math.sqrt(d // HEADS)
            a = a.masked_fill(~self.causal, float("-inf")).softmax(-1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, s, d))

    def forward(self, x):
        x = x + self.attend(self.rms(x) if self.llama else self.norm1(x))
        y = self.rms(x) if self.llama else self.norm1(x)
        return x + self.fc2(F.gelu(self.fc1(y), approximate="tanh" if self.llama else "none"))


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt, self.llama = Block(False), Block(True)

    def forward(self, x):
        return self.llama(self.gpt(x))


def main() -> None:
    torch.manual_seed(0)
    out = Path(__file__).with_name("torch_gpt_block.onnx")
    torch.onnx.export(TwoBlocks().eval(), (torch.randn(2, SEQ, D),), str(out),
                      input_names=["x"], output_names=["y"], opset_version=16, dynamo=False)


if __name__ == "__main__":
    main()
