"""Writes torch_decoder_mask.onnx, torch_bert_mask.onnx and torch_sdpa_causal.onnx
beside this file (the third: F.scaled_dot_product_attention(is_causal=True) over a
dynamic batch and seq, which torch writes as Trilu over an Expand of a shape value).

The first: a tiny GPT-style decoder with a KV cache and the causal mask written as
users write it, exported by torch.onnx with dynamic axes batch, seq and past:
positions `torch.arange(past, past + s)` (Range of symbolic bounds), the mask
`torch.arange(past + s)[None, :] > (torch.arange(s) + past)[:, None]` (Range, Add of a
symbolic scalar, Unsqueeze, Greater), expanded to [b, 1, s, past + s] (Expand of a
shape value) and applied with masked_fill (Where); the second layer adds
`torch.full((s, past + s), -inf).triu(past + 1)` instead (ConstantOfShape of a shape
value, Trilu with a symbolic k). The second model: a tiny BERT-style
encoder (dynamic batch and seq) whose attention_mask [batch, seq] is expanded the
usual way to [batch, 1, seq, seq] and turned into an additive bias, positions sliced
from a registered buffer (`position_ids[:, :s]`: a Slice whose end is a symbolic
value). tests/runtime/test_vm_symbolic_shapes.py builds them as VM libraries and
compares with onnxruntime. Needs torch (CPU wheel); the committed .onnx files are what
the test uses.

    python tests/tools/data/make_torch_decoder_mask.py
"""

import math
from pathlib import Path

import torch
from torch import nn

D, HEADS, VOCAB, MAX_POS, LAYERS = 32, 2, 64, 128, 2


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, past_k, past_v, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, HEADS, d // HEADS).transpose(1, 2) for t in (q, k, v))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        a = q @ k.transpose(-2, -1) / math.sqrt(d // HEADS)
        # the first layer masks with the boolean mask, the second adds triu's table
        a = a.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else a + mask
        a = a.softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x)))), k, v


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids, *cache):
        b, s = ids.shape
        past = cache[0].shape[2]
        x = self.tokens(ids) + self.positions(torch.arange(past, past + s))
        mask = torch.arange(past + s)[None, :] > (torch.arange(s) + past)[:, None]
        mask = mask[None, None].expand(b, 1, s, past + s)
        triu = torch.full((s, past + s), float("-inf")).triu(past + 1)  # Trilu, k symbolic
        present = []
        for k, layer in enumerate(self.layers):
            x, pk, pv = layer(x, cache[2 * k], cache[2 * k + 1], mask if k == 0 else triu)
            present += [pk, pv]
        return (self.head(x), *present)


class Bert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.register_buffer("position_ids", torch.arange(MAX_POS)[None])
        self.norm, self.qkv, self.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, ids, attention_mask):
        b, s = ids.shape
        x = self.norm(self.tokens(ids) + self.positions(self.position_ids[:, :s]))
        bias = attention_mask[:, None, None, :].expand(b, 1, s, s).to(torch.float32)
        bias = (1.0 - bias) * torch.finfo(torch.float32).min
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(b, s, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        a = (q @ k.transpose(-2, -1) / math.sqrt(D // HEADS) + bias).softmax(-1) @ v
        return x + self.proj(a.transpose(1, 2).reshape(b, s, D))


class CausalSdpa(nn.Module):
    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def main() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, HEADS, 5, D // HEADS)
    torch.onnx.export(CausalSdpa(), (q, q, q), str(Path(__file__).with_name(
        "torch_sdpa_causal.onnx")), input_names=["q", "k", "v"], output_names=["y"],
        dynamic_axes={n: {0: "batch", 2: "seq"} for n in "qkvy"}, opset_version=17,
        dynamo=False)
    bert = Path(__file__).with_name("torch_bert_mask.onnx")
    ids, mask = torch.randint(0, VOCAB, (2, 5)), torch.ones(2, 5, dtype=torch.int64)
    torch.onnx.export(Bert().eval(), (ids, mask), str(bert),
                      input_names=["ids", "attention_mask"], output_names=["y"],
                      dynamic_axes={n: {0: "batch", 1: "seq"}
                                    for n in ("ids", "attention_mask", "y")},
                      opset_version=17, dynamo=False)
    out = Path(__file__).with_name("torch_decoder_mask.onnx")
    cache_names = [f"past_{kv}_{k}" for k in range(LAYERS) for kv in "kv"]
    present_names = [f"present_{kv}_{k}" for k in range(LAYERS) for kv in "kv"]
    cache = [torch.randn(2, HEADS, 3, D // HEADS) for _ in cache_names]
    axes = {"ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in cache_names})
    axes.update({n: {0: "batch", 2: "present"} for n in present_names})
    torch.onnx.export(Decoder().eval(), (torch.randint(0, VOCAB, (2, 5)), *cache), str(out),
                      input_names=["ids", *cache_names],
                      output_names=["logits", *present_names], dynamic_axes=axes,
                      opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
