"""Weights for the Ray workers as uint8 numpy views (what the object store reads in place): packing a
contiguous CPU tensor copies nothing, and unpacking gives back every dtype and shape exactly."""
from __future__ import annotations

import numpy as np
import torch

from upslope.distributed.ray_workers import pack_weights, unpack_weights


def test_pack_and_unpack_round_trip_every_dtype_and_shape():
    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(3, 5, generator=g), "b16": torch.randn(4, 2, generator=g).to(torch.bfloat16),
               "half": torch.randn(7, generator=g).half(), "scalar": torch.tensor(2.5),
               "strided": torch.randn(4, 6, generator=g).t(), "empty": torch.zeros(0, 3)}
    packed = pack_weights(tensors.items())
    assert all(raw.dtype == np.uint8 and raw.ndim == 1 for raw, _, _ in packed.values())
    back = dict(unpack_weights(packed))
    assert back.keys() == tensors.keys()
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch.equal(back[k], t), k


def test_packing_a_contiguous_cpu_tensor_copies_nothing():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    raw, dtype, shape = pack_weights([("t", t)])["t"]
    assert raw.ctypes.data == t.data_ptr() and (dtype, shape) == ("float32", (3, 4))
    unpacked = dict(unpack_weights({"t": (raw, dtype, shape)}))["t"]
    assert unpacked.data_ptr() == t.data_ptr()  # a view, as a worker's is of the object store's buffer
