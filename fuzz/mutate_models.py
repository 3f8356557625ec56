#!/usr/bin/python3
"""Semantic mutations of the test models, as extra seeds for onnx_loader_fuzzer.

Byte-level fuzzing rarely produces a protobuf that is still a well-formed model with an absurd
axis or shape, which is what reaches libonnx's shape inference and the importers. This script
takes the valid test models and changes what a confused exporter could: attribute ints, integer
initializers (axes, shapes, sizes), declared dims, op types, input/output counts, opset and IR
versions, extra attributes of the wrong type, element types.

usage: fuzz/mutate_models.py OUT_DIR SEED COUNT
then:  .build/fuzz/fuzz/onnx_loader_fuzzer -max_total_time=240 /tmp/corpus OUT_DIR fuzz/corpus/onnx_loader
"""
import copy
import os
import random
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx"))
import make_test_models as tm  # noqa: E402

WEIRD_INTS = [-(2**63), -(2**31), -100, -5, -2, -1, 0, 1, 2, 3, 5, 7, 100, 2**31, 2**40, 2**62]
OPS = ["Reshape", "Split", "Squeeze", "Unsqueeze", "Gather", "Concat", "Transpose", "Slice",
       "Expand", "Range", "ReduceSum", "Softmax", "Gemm", "MatMul", "Trilu", "LayerNormalization",
       "SoftmaxCrossEntropyLoss", "Dropout", "Cast", "Constant", "ConstantOfShape", "Where",
       "Shape", "Flatten"]
ATTRS = ["axis", "axes", "perm", "to", "split", "keepdims", "value", "num_outputs", "upper",
         "start", "end"]


def mutate(m, rng):
    g = m.graph
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(9)
        if k == 0 and g.node:
            n = rng.choice(g.node)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.INT:
                    a.i = rng.choice(WEIRD_INTS)
                if a.type == onnx.AttributeProto.INTS:
                    a.ints[:] = [rng.choice(WEIRD_INTS) for _ in range(rng.randint(0, 5))]
        elif k == 1 and g.initializer:
            t = rng.choice(g.initializer)
            if t.data_type == TensorProto.INT64:
                vals = [rng.choice(WEIRD_INTS) for _ in range(rng.randint(0, 4))]
                t.CopyFrom(numpy_helper.from_array(np.array(vals, np.int64), t.name))
        elif k == 2:
            for v in list(g.input) + list(g.output) + list(g.value_info):
                if v.type.tensor_type.HasField("shape"):
                    for d in v.type.tensor_type.shape.dim:
                        if rng.random() < 0.3:
                            d.dim_value = rng.choice([0, 1, 2, 3, 7, 2**20])
        elif k == 3 and g.node:
            rng.choice(g.node).op_type = rng.choice(OPS)
        elif k == 4 and g.node:
            n = rng.choice(g.node)
            if rng.random() < 0.5 and n.input:
                del n.input[-1]
            else:
                pool = [i.name for i in g.input] + [t.name for t in g.initializer] + [""]
                n.input.append(rng.choice(pool))
        elif k == 5 and g.node:
            n = rng.choice(g.node)
            if rng.random() < 0.5:
                n.output.append(f"extra{rng.randrange(100)}")
            elif len(n.output) > 1:
                del n.output[-1]
        elif k == 6:
            m.opset_import[0].version = rng.choice([13, 14, 15, 16, 17, 18, 19, 20, 21])
            m.ir_version = rng.choice([3, 7, 8, 9, 10])
        elif k == 7 and g.node:
            value = rng.choice([1, -7, 2**40, [1, 2], [0], 1.5, "x",
                                numpy_helper.from_array(np.array([3], np.int64))])
            rng.choice(g.node).attribute.append(helper.make_attribute(rng.choice(ATTRS), value))
        elif k == 8 and g.input:
            rng.choice(list(g.input)).type.tensor_type.elem_type = rng.choice(
                [1, 2, 3, 6, 7, 9, 10, 11, 16])


def main():
    out, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    base = {}
    base.update(tm.op_models())
    base.update(tm.opset_variant_models())
    base.update(tm.misc_models())
    names = sorted(base)
    for i in range(count):
        m = copy.deepcopy(base[rng.choice(names)])
        mutate(m, rng)
        with open(os.path.join(out, f"mut_{seed}_{i}"), "wb") as f:
            f.write(m.SerializeToString())


if __name__ == "__main__":
    main()
