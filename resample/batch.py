"""Many streams' fixed-size chunks through their own resamplers in one batched matmul.

Why: the media clock resamples every call's 20 ms frame on the same tick. Per call, a
:class:`~resample.Resampler` fast-path chunk is a handful of numpy calls (~8 us, mostly call
overhead); stacking the calls makes that once per tick. Each stream keeps its own history
(state stays per call), and by the exactness argument in :mod:`resample.resampler` every
output is an exact integer sum, so the batched result is bit for bit what each stream's own
:meth:`~resample.Resampler.process` would return.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from resample.resampler import Resampler

__all__ = ["process_many"]

_INT16 = np.dtype(np.int16)


def _batchable(group: Sequence[Resampler], n: int) -> bool:
    """All in the same steady int16 fast-path state for chunks of n (the same shared plan)."""
    first = group[0]._fast
    if first is None or first[0] != (n,) or first[1] is not _INT16:
        return False
    h, key, strides, shape = first[4], first[0], first[3].strides, first[3].shape
    buf_shape = group[0]._buf.shape
    for r in group:
        f = r._fast
        if f is None or f[4] is not h or f[0] != key or f[1] is not _INT16:
            return False
        xv = f[3]
        if xv.strides != strides or xv.shape != shape or r._buf.shape != buf_shape:
            return False
    return True


def process_many(resamplers: Sequence[Resampler], frames: NDArray[np.int16]) -> NDArray[np.int16]:
    """Row i of ``frames`` (shape ``[n, chunk]``) through ``resamplers[i]``; rows out.

    Streams that are not all in one steady fast-path state (the first two chunks of a
    stream, after a reset, other chunk sizes) are processed one by one: same result.
    """
    x = np.asarray(frames)
    if x.ndim != 2 or x.shape[0] != len(resamplers):
        raise ValueError("frames must be [len(resamplers), chunk]")
    if x.dtype != np.int16:
        raise TypeError("process_many takes int16 frames")
    n_streams, n = x.shape
    if n_streams == 0:
        return np.empty((0, 0), dtype=np.int16)
    batchable = n_streams > 1 and _batchable(resamplers, n)
    if n_streams > 1 and not batchable:  # batch the steady ones only
        steady = [i for i, r in enumerate(resamplers) if _batchable([r], n)]
        ref = resamplers[steady[0]] if steady else None
        same = [i for i in steady if ref is not None and _batchable([ref, resamplers[i]], n)]
        if len(same) > 1:
            rows: list[NDArray[np.int16] | None] = [None] * n_streams
            batched = process_many([resamplers[i] for i in same], x[same])
            for i, row in zip(same, batched, strict=True):
                rows[i] = row
            for i, r in enumerate(resamplers):
                if rows[i] is None:
                    rows[i] = r.process(x[i])
            return np.stack(rows)  # type: ignore[arg-type]
    if not batchable:
        return np.stack([r.process(row) for r, row in zip(resamplers, x, strict=True)])
    r0 = resamplers[0]
    _, _, _, xv0, h, _, _, _, _ = r0._fast  # type: ignore[misc]
    hist = r0._hist_len
    # [streams, hist + chunk + slack]; concatenate + reshape: np.stack's per-array Python
    # work cost more than the copy here
    buf = np.concatenate([r._buf for r in resamplers]).reshape(n_streams, -1)
    buf[:, hist : hist + n] = x
    start = (xv0.__array_interface__["data"][0] - r0._buf.__array_interface__["data"][0]) // 8
    batches, _, span = xv0.shape
    stride = xv0.strides[0] // 8
    row = buf.strides[0]
    # as_strided, without its Python overhead: the windows stay inside buf (as in r0._buf)
    windows: NDArray[np.float64] = np.ndarray(
        (n_streams, batches, span), np.float64, buf, 8 * start, (row, 8 * stride, 8)
    )
    # Small gemvs, as in the per-stream fast path: one big gemm measured 10-25x slower here
    # (BLAS threads on a loaded 2-core machine).
    y = np.matmul(windows[:, :, None, :], h)  # [streams, batches, 1, G]
    y = y.reshape(n_streams, -1)
    np.rint(y, out=y)
    np.minimum(y, 32767.0, out=y)  # np.clip, without its Python dispatch
    np.maximum(y, -32768.0, out=y)
    new_hist = buf[:, n : n + hist]
    for r, h_row in zip(resamplers, new_hist, strict=True):
        r._buf[:hist] = h_row
    out: NDArray[np.int16] = y.astype(np.int16)
    return out
