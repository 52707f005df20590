"""Interop of src/safetensors.c with the python `safetensors` package (the upstream format).

- files written by safetensors.numpy.save_file (every dtype numpy/ml_dtypes give, empty and
  scalar tensors, metadata, many tensors) are read by tests/helpers/st_dump, and every
  tensor's name, dtype, shape, size and FNV-1a-64 of its bytes match what python computes;
- files written by our writer (`st_dump --write`, pattern documented in st_dump.c) load in
  python bit-identically (safetensors.deserialize for every dtype, safe_open's numpy arrays
  for every dtype but F8_*, which the package's numpy view cannot build), with the metadata;
- malformed files (truncated, header length too large, bad JSON, gaps) that upstream rejects
  make st_dump exit 1 with a message naming the file.
"""
import json
import os
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stn
from safetensors import safe_open

BUILD = os.environ.get("FP4MOE_BUILD", os.path.join(os.path.dirname(__file__), "../../build"))
ST_DUMP = os.path.join(BUILD, "helpers", "st_dump")

# numpy dtype -> safetensors dtype string (what the upstream serializer writes)
DTYPES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16", np.dtype(np.int16): "I16", np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32", np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
    np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0", np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
}
NP_OF = {v: k for k, v in DTYPES.items()}


def fnv1a64(b: bytes) -> str:
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_dump(*args):
    assert os.path.exists(ST_DUMP), f"{ST_DUMP} not built"
    return subprocess.run([ST_DUMP, *args], capture_output=True, text=True, timeout=60)


def parse_dump(out: str):
    tensors, meta = {}, {}
    for line in out.splitlines():
        if line.startswith("meta: "):
            k, v = line[len("meta: "):].split(" = ", 1)
            meta[k] = v
            continue
        name, dtype, shape, nbytes, h = line.split(" ")
        dims = [int(d) for d in shape.strip("[]").split(",") if d]
        tensors[name] = (dtype, dims, int(nbytes), h)
    return tensors, meta


def random_tensor(rng, dtype, shape):
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    if np.dtype(dtype) == np.dtype(np.bool_):
        raw &= 1
    return raw.view(dtype).reshape(shape)


def check_dump_matches(path, tensors, metadata):
    r = run_dump(path)
    assert r.returncode == 0, r.stderr
    got, meta = parse_dump(r.stdout)
    assert sorted(got) == sorted(tensors)
    assert list(got) == sorted(got, key=lambda s: s.encode())  # name order
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        assert got[name] == (DTYPES[arr.dtype], list(arr.shape), len(b), fnv1a64(b)), name
    assert meta == (metadata or {})


def test_python_written_every_dtype(tmp_path):
    rng = np.random.default_rng(1234)
    tensors = {}
    for i, dt in enumerate(DTYPES):
        shape = [(3, 5), (17,), (2, 3, 4), (1, 1, 7)][i % 4]
        tensors[f"model.layers.{i}.{DTYPES[dt].lower()}.weight"] = random_tensor(rng, dt, shape)
    tensors["empty.f32"] = np.zeros((0, 4), np.float32)
    tensors["empty.bf16"] = np.zeros((3, 0), ml_dtypes.bfloat16)
    tensors["scalar.f64"] = np.array(3.25, np.float64)
    tensors["scalar.i8"] = np.array(-3, np.int8)
    metadata = {"format": "np", "note": "spaces and = signs", "unicode": "\u00e9\u20ac"}
    path = str(tmp_path / "every.safetensors")
    stn.save_file(tensors, path, metadata=metadata)
    check_dump_matches(path, tensors, metadata)


def test_python_written_many_tensors(tmp_path):
    rng = np.random.default_rng(7)
    kinds = list(DTYPES)
    tensors = {}
    for i in range(600):
        dt = kinds[rng.integers(len(kinds))]
        shape = tuple(int(d) for d in rng.integers(0, 5, size=rng.integers(0, 4)))
        tensors[f"blk.{i}.w{rng.integers(100)}"] = random_tensor(rng, dt, shape)
    path = str(tmp_path / "many.safetensors")
    stn.save_file(tensors, path)
    check_dump_matches(path, tensors, None)


def expected_set():
    """The fixed set st_dump --write produces (see st_dump.c)."""
    spec = [("t00.bool", "BOOL", [13]), ("t01.u8", "U8", [3, 5]), ("t02.i8", "I8", [17]),
            ("t03.u16", "U16", [2, 3]), ("t04.i16", "I16", [2, 1, 3]), ("t05.u32", "U32", [7]),
            ("t06.i32", "I32", [4, 2]), ("t07.u64", "U64", [3]), ("t08.i64", "I64", [1, 5]),
            ("t09.f8_e4m3", "F8_E4M3", [4, 16]), ("t10.f8_e5m2", "F8_E5M2", [33]),
            ("t11.f8_e8m0", "F8_E8M0", [4, 2]), ("t12.bf16", "BF16", [8, 3]),
            ("t13.f16", "F16", [11]), ("t14.f32", "F32", [2, 3, 4]), ("t15.f64", "F64", [6]),
            ("t16.scalar_f32", "F32", []), ("t17.empty_bf16", "BF16", [0, 4]),
            ("t18.u8_big", "U8", [300, 1000])]
    out = {}
    for t, (name, dt, shape) in enumerate(spec):
        nbytes = int(np.prod(shape, dtype=np.int64)) * NP_OF[dt].itemsize
        b = ((np.arange(nbytes, dtype=np.int64) * 131 + t * 29 + 7) % 256).astype(np.uint8)
        if dt == "BOOL":
            b &= 1
        out[name] = (dt, shape, b.tobytes())
    return out


def test_our_writer_loads_in_python(tmp_path):
    path = str(tmp_path / "ours.safetensors")
    r = run_dump("--write", path)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(path + ".tmp")
    want = expected_set()
    raw = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert hlen % 8 == 0
    # raw view: upstream's deserializer, every dtype, bytes bit-identical
    got = dict(safetensors.deserialize(raw))
    assert sorted(got) == sorted(want)
    for name, (dt, shape, b) in want.items():
        assert got[name]["dtype"] == dt, name
        assert list(got[name]["shape"]) == shape, name
        assert bytes(got[name]["data"]) == b, name
    # numpy view: safe_open gives arrays of the right numpy dtype. safetensors 0.8.0's numpy
    # view cannot build F8_* arrays (it looks for np.float8_*, which numpy lacks), so those are
    # checked through the raw view above only; BF16 works once ml_dtypes is imported.
    with safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "fp4moe-test", "pattern": "(i*131+t*29+7)%256"}
        assert sorted(f.keys()) == sorted(want)
        for name, (dt, shape, b) in want.items():
            if dt.startswith("F8_"):
                continue
            a = f.get_tensor(name)
            assert a.dtype == NP_OF[dt], name
            assert list(a.shape) == shape, name
            assert a.tobytes() == b, name
    # and our reader agrees with itself
    r = run_dump(path)
    assert r.returncode == 0, r.stderr
    tensors, meta = parse_dump(r.stdout)
    for name, (dt, shape, b) in want.items():
        assert tensors[name] == (dt, shape, len(b), fnv1a64(b)), name


def upstream_rejects(path):
    with pytest.raises(Exception):
        with safe_open(path, framework="np") as f:
            f.keys()


def good_file(tmp_path):
    path = str(tmp_path / "good.safetensors")
    stn.save_file({"a": np.arange(12, dtype=np.float32).reshape(3, 4),
                   "b": np.arange(5, dtype=np.uint8)}, path, metadata={"k": "v"})
    return open(path, "rb").read()


def header_file(obj_bytes, data=b""):
    return struct.pack("<Q", len(obj_bytes)) + obj_bytes + data


@pytest.mark.parametrize("case", ["truncated_data", "truncated_header", "short", "header_too_long",
                                  "header_past_end", "bad_json", "gap", "trailing", "size_mismatch"])
def test_malformed_rejected(tmp_path, case):
    good = good_file(tmp_path)
    (hlen,) = struct.unpack("<Q", good[:8])
    a = json.dumps({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                    "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}).encode()
    blob, expect = {
        "truncated_data": (good[:-3], "past the data buffer"),
        "truncated_header": (good[: 8 + hlen // 2], "runs past the end of the file"),
        "short": (good[:5], "shorter than the 8-byte"),
        "header_too_long": (struct.pack("<Q", 200 * 1024 * 1024) + good[8:], "exceeds the limit"),
        "header_past_end": (struct.pack("<Q", len(good)) + good[8:], "runs past the end"),
        "bad_json": (header_file(b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]'),
                     "not valid JSON"),
        "gap": (header_file(a, b"x" * 6), "gap of 2 unused bytes"),
        "trailing": (good + b"\0\0", "2 trailing bytes"),
        "size_mismatch": (header_file(b'{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}',
                                      b"x" * 8), "= 12 bytes, but data_offsets span 8 bytes"),
    }[case]
    path = str(tmp_path / f"{case}.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    upstream_rejects(path)
    r = run_dump(path)
    assert r.returncode == 1
    assert f"file '{path}'" in r.stderr
    assert expect in r.stderr, r.stderr
    assert r.stdout == ""
    assert open(path, "rb").read() == blob
