"""The CUDA runner's step inputs: staged in pinned host memory, then copied into persistent
device buffers. The captured graphs read the device buffers in place, so their addresses never
change; a step writes the host side with numpy and uploads only the rows it uses."""
from __future__ import annotations

import torch


class StagedBuffer:
    """A pinned host tensor and the device tensor of the same shape it is uploaded to."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, pinned: bool,
                 host_fill: int = 0, device_fill: int = 0):
        self.host = torch.full(shape, host_fill, dtype=dtype, pin_memory=pinned)
        self.device = torch.full(shape, device_fill, dtype=dtype, device=device)

    def upload(self, rows: int | None = None) -> None:
        """Copy the first `rows` rows (all without `rows`) host -> device, asynchronously."""
        if rows is None:
            self.device.copy_(self.host, non_blocking=True)
        else:
            self.device[:rows].copy_(self.host[:rows], non_blocking=True)


class StagingBuffers:
    """Per-token rows (ids, positions, KV slots), per-decode rows (context lengths, block tables)
    and, for the mixed layout, per-prefill-chunk rows (block tables, query starts, context
    lengths). Device padding defaults are harmless: slot -1 writes no KV, context 1 attends to
    one token."""

    def __init__(self, max_tokens: int, max_seqs: int, max_chunks: int, max_blocks: int,
                 device: torch.device, pinned: bool):
        def buf(shape, dtype, host_fill=0, device_fill=0):
            return StagedBuffer(shape, dtype, device, pinned, host_fill, device_fill)

        self.ids = buf((max_tokens,), torch.long)
        self.pos = buf((max_tokens,), torch.long)
        self.slots = buf((max_tokens,), torch.long, device_fill=-1)
        self.ctx = buf((max_seqs,), torch.int32, device_fill=1)
        self.tables = buf((max_seqs, max_blocks), torch.int32)
        self.pf_tables = buf((max_chunks, max_blocks), torch.int32)
        self.pf_starts = buf((max_chunks + 1,), torch.int32)
        self.pf_ctx = buf((max_chunks,), torch.int32, host_fill=1, device_fill=1)

    def upload_rows(self, rows: int, decode_rows: int) -> None:
        """Ids, positions and slots of `rows` rows, and the context lengths and block tables of
        the first `decode_rows`."""
        for b in (self.ids, self.pos, self.slots):
            b.upload(rows)
        self.ctx.upload(decode_rows)
        self.tables.upload(decode_rows)

    def upload_chunks(self) -> None:
        """The mixed layout's prefill-chunk metadata (fixed size: unused chunks are empty)."""
        for b in (self.pf_tables, self.pf_starts, self.pf_ctx):
            b.upload()
