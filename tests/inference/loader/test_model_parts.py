"""Assembling a GGUF file from part packages: atomic, hash-checked, clear errors naming the package."""
from __future__ import annotations

import hashlib
import sys

import pytest

from inference.loader.model_parts import PartsSpec, assemble, assembled_path


def _parts(tmp_path, monkeypatch, prefix: str, chunks: list[bytes]) -> None:
    """Installs `prefix1..N` as importable packages, each with data/partNN.bin."""
    root = tmp_path / "site"
    for i, chunk in enumerate(chunks, 1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m.startswith(prefix)]:
        monkeypatch.delitem(sys.modules, name)


def _spec(prefix: str, data: bytes, count: int, sha: str | None = None) -> PartsSpec:
    return PartsSpec(prefix, count, "model.gguf", len(data), sha or hashlib.sha256(data).hexdigest(), "1.0")


def test_parts_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    chunks = [bytes([i]) * (1000 + 37 * i) for i in range(1, 4)]
    _parts(tmp_path, monkeypatch, "tpa_part", chunks)
    data = b"".join(chunks)
    out = assemble(_spec("tpa_part", data, 3), tmp_path / "cache", progress=False)
    assert out.read_bytes() == data
    assert [p.name for p in out.parent.iterdir()] == ["model.gguf"]      # no temporary file left
    assert assemble(_spec("tpa_part", data, 3), tmp_path / "cache", progress=False) == out


def test_a_hash_mismatch_leaves_nothing_and_names_the_packages(tmp_path, monkeypatch):
    chunks = [b"a" * 500, b"b" * 300]
    _parts(tmp_path, monkeypatch, "tpb_part", chunks)
    spec = _spec("tpb_part", b"".join(chunks), 2, sha="0" * 64)
    with pytest.raises(ValueError, match=r"sha256 .* does not match the pinned 0{64}.*tpb-part1==1.0"):
        assemble(spec, tmp_path / "cache", progress=False)
    assert not assembled_path(spec, tmp_path / "cache").exists()
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_a_missing_part_names_its_package(tmp_path, monkeypatch):
    _parts(tmp_path, monkeypatch, "tpc_part", [b"x" * 10, b"y" * 10])
    spec = _spec("tpc_part", b"x" * 30, 3)
    with pytest.raises(ValueError, match=r"part 3 of 3 is missing: the Python package 'tpc-part3' is not installed"):
        assemble(spec, tmp_path / "cache", progress=False)


def test_a_truncated_part_is_caught_before_hashing(tmp_path, monkeypatch):
    _parts(tmp_path, monkeypatch, "tpd_part", [b"x" * 10, b"y" * 9])
    with pytest.raises(ValueError, match="hold 19 bytes, expected 20"):
        assemble(_spec("tpd_part", b"x" * 10 + b"y" * 10, 2), tmp_path / "cache", progress=False)


def test_a_spec_without_a_hash_is_refused():
    with pytest.raises(ValueError, match="sha256"):
        PartsSpec("p", 2, "f.gguf", 10, "abc")
