"""Writes torch_cnn.onnx beside this file: a small CNN exported by PyTorch's own
ONNX exporter, the kind of file users bring (the `pipeline` command's acceptance
test compiles it; tests/tools/test_cli.py). Needs torch (pip install torch==2.13.0, CPU);
the committed .onnx is what the tests use, so neither the product nor the tests
need torch. The batch axis is symbolic ("batch"), as exporters write it.

    python tests/tools/data/make_torch_cnn.py
"""

from pathlib import Path

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16),
                                   nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=4))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(16),
                                  nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(y + self.block(y))
        return torch.softmax(self.head(y), dim=-1)


def main() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running statistics
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    out = Path(__file__).with_name("torch_cnn.onnx")
    torch.onnx.export(model, (torch.randn(1, 3, 32, 32),), str(out), input_names=["x"],
                      output_names=["probs"], dynamic_axes={"x": {0: "batch"},
                                                            "probs": {0: "batch"}},
                      opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
