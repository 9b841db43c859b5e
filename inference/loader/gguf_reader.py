"""A GGUF file's header read lean: scalar metadata, and each tensor's name, type, shape and bytes
(a memory map, nothing copied). The `gguf` package's reader builds a numpy view per vocabulary
string (~15 s for Qwen2's 151,936 tokens here); this skips arrays it is not asked for.

    "GGUF" | version u32 | tensors u64 | kv u64 | kv * (key, type u32, value)
           | tensors * (name, dims u32, dims * u64, type u32, offset u64) | pad to alignment | data

Strings are a u64 length and UTF-8 bytes; an array is (item type u32, count u64, items).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str            # GGML type: F32, Q4_K, ...
    shape: tuple[int, ...]    # ggml order: innermost first
    data: np.ndarray          # the raw bytes (uint8), mapped from the file


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError("the header runs past the end of the file")
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, vtype: int):
        """A scalar or string; an array is skipped (None), as the engine needs none of them."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            itype, count = self.take("<I"), self.take("<Q")
            if itype in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[itype])
            else:
                for _ in range(count):
                    self.value(itype)
            return None
        raise ValueError(f"unknown metadata value type {vtype}")


def read_gguf(path: Path) -> tuple[dict[str, object], dict[str, TensorInfo]]:
    """(scalar metadata by key, tensors by name); a ValueError for a file that is not GGUF or is cut."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data))
    if bytes(data[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    cur.pos = 4
    version, num_tensors, num_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (2 or later)")
    meta: dict[str, object] = {}
    for _ in range(num_kv):
        key = cur.string()
        value = cur.value(cur.take("<I"))
        if value is not None:
            meta[key] = value
    infos = []
    for _ in range(num_tensors):
        name = cur.string()
        dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
        ttype, offset = cur.take("<I"), cur.take("<Q")
        infos.append((name, dims, ttype, offset))
    align = int(meta.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    tensors = {}
    for name, dims, ttype, offset in infos:
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise ValueError(f"tensor {name!r} has an unknown GGML type id {ttype}") from None
        block, size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(dims)) if dims else 1
        nbytes = count // block * size
        begin = start + offset
        if begin + nbytes > data.size:
            raise ValueError(f"tensor {name!r} ends past the end of the file ({begin + nbytes} > {data.size} "
                             "bytes): it is truncated")
        tensors[name] = TensorInfo(name, qtype.name, dims, data[begin:begin + nbytes])
    return meta, tensors


def drop_resident_pages(tensors: dict[str, TensorInfo]) -> None:
    """Tell the kernel the file's pages read so far are not needed now (they are clean: it drops
    them, and a later read of a row faults it back in). Loading reads every tensor once; without
    this the whole file would stay counted in the process's RSS."""
    import mmap
    first = next(iter(tensors.values()), None)
    mapped = getattr(first.data, "_mmap", None) if first is not None else None
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)
