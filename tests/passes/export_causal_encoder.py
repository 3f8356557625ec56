"""Exports one nn.TransformerEncoderLayer run with the standard causal src_mask
(nn.Transformer.generate_square_subsequent_mask: -inf above the diagonal, built inside forward from
S), the PyTorch-idiomatic causal encoder that models/export.py does not cover. torch 1.13's exporter
writes the mask as ConstantOfShape -> Trilu and the scores as baddbmm (Mul by 1 on both sides).

usage: export_causal_encoder.py OUT.onnx
"""
import sys

import torch
from torch import nn


class CausalEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.1, activation="gelu", batch_first=True)

    def forward(self, x):  # (B, S, 32)
        s = x.size(1)
        mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
        return self.layer(x, src_mask=mask)


def main():
    torch.manual_seed(0)
    model = CausalEncoder()
    torch.onnx.export(model, (torch.randn(2, 6, 32),), sys.argv[1], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "B", 1: "S"}, "y": {0: "B", 1: "S"}})


if __name__ == "__main__":
    main()
