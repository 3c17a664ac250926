"""Store an int8 QDQ model's weights as uint8, so every x86-64 CPU computes it exactly.

Why: smart-turn ships as a QDQ graph with uint8 activations and int8 weights. ONNX Runtime
fuses that into u8 x s8 integer matrix products, and on CPUs without VNNI (AVX2, AVX-512F)
its kernels multiply u8 x s8 pairs with ``vpmaddubsw``, whose 16-bit sums saturate: the
model's output moves with the CPU (one window of beckett.wav scored 0.53 with AVX-512 VNNI,
0.14 on the AVX2 path). With VNNI or AMX the products are exact. Stored as uint8 (each
weight and its zero point shifted by 128, which leaves ``(q - zero_point) * scale``, and so
the model, unchanged), ONNX Runtime runs u8 x u8 kernels that widen to 16 bits before they
multiply: exact on every path, bit-identical to the VNNI result, at about twice the CPU of
the s8 kernel on a VNNI CPU. :class:`agent.voice.turn.SmartTurn` keeps both graphs and uses the
shipped one where it is exact.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["int8_weights_to_uint8", "unsigned_weights"]

#: Where a rewritten initializer may appear: a DequantizeLinear's input or zero point.
_DEQUANTIZE_SLOTS = (("DequantizeLinear", 0), ("DequantizeLinear", 2))


def unsigned_weights(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: every int8 initializer that is only ever a
    DequantizeLinear's input or zero point becomes uint8 (+128). Returns how many were
    rewritten; raises ValueError where a rewrite would change what the graph computes."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            uses[name].append((node.op_type, slot))
    chosen: set[str] = set()
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        x = inits.get(node.input[0])
        if x is None or x.data_type != TensorProto.INT8:
            continue
        zero = node.input[2] if len(node.input) > 2 else ""
        if zero not in inits or inits[zero].data_type != TensorProto.INT8:
            # without an int8 zero point the shift has nowhere to go (int8 default: 0)
            raise ValueError(f"DequantizeLinear {node.name!r}: int8 weights need a zero point")
        chosen.update((node.input[0], zero))
    for name in sorted(chosen):
        other = [
            u for u in uses[name] if u not in (("DequantizeLinear", 0), ("DequantizeLinear", 2))
        ]
        if other or any(o.name == name for o in graph.output):
            raise ValueError(f"initializer {name!r} is used outside DequantizeLinear: {other}")
    for i, tensor in enumerate(graph.initializer):
        if tensor.name in chosen:
            shifted = numpy_helper.to_array(tensor).astype(np.int16) + 128
            graph.initializer[i].CopyFrom(
                numpy_helper.from_array(shifted.astype(np.uint8), tensor.name)
            )
    return len(chosen)


def int8_weights_to_uint8(src: Path, dst: Path) -> None:
    """The model store's converter: ``src`` (a QDQ ONNX file) rewritten into ``dst``."""
    model = onnx.load(str(src))
    if unsigned_weights(model) == 0:
        raise ValueError(f"{src.name}: no int8 weights to rewrite")
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
