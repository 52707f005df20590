"""Shared fixtures and helpers of the end-to-end tests of the `fp4moe` command-line tool.

The tool is the one CTest names in FP4MOE_BIN (tests/py/test_*.py run through pytest with
FP4MOE_BIN, FP4MOE_BUILD and FP4MOE_SRC set). Independent references used here: the python
`safetensors` package (file reading, every dtype through safetensors.deserialize), numpy and
ml_dtypes (float4_e2m1fn, float8_e4m3fn: round to nearest even) for the NVFP4 / MXFP8 codecs
of DESIGN.md section 2, written again here, not taken from the C code.

Limits: helpers read whole files into memory (fine for the tiny preset and hand-made
checkpoints); `gen_tiny` caches one generated directory per option set for the session, so a
test that modifies a directory must work on `copy_model(...)` of it.
"""
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
import safetensors

F4 = ml_dtypes.float4_e2m1fn
E4 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)

# safetensors dtype string -> numpy dtype (F8_E8M0 is read as raw uint8 codes)
ST_NP = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
    "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
    "F8_E4M3": E4, "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": np.uint8, "BF16": BF16,
    "F16": np.float16, "F32": np.float32, "F64": np.float64,
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: writes ~1 GB (runs in CI; deselect locally with -m 'not slow')")


# ---- running the tool --------------------------------------------------------------------

@dataclass
class Result:
    rc: int
    out: str
    err: str
    args: tuple

    def __str__(self):
        return f"fp4moe {' '.join(map(str, self.args))} -> rc {self.rc}\nstdout:\n{self.out}\nstderr:\n{self.err}"

    def json(self):
        return json.loads(self.out)


def tool_path():
    p = os.environ.get("FP4MOE_BIN")
    if not p and os.environ.get("FP4MOE_BUILD"):
        p = os.path.join(os.environ["FP4MOE_BUILD"], "fp4moe")
    assert p, "FP4MOE_BIN is not set: run through ctest, or export FP4MOE_BIN=<build>/fp4moe"
    assert os.access(p, os.X_OK), f"FP4MOE_BIN '{p}' is not an executable: build the fp4moe target"
    return p


def run(*args, timeout=300, check=None):
    """Run `fp4moe args...`; returns Result. check=rc asserts that exit status."""
    r = subprocess.run([tool_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    res = Result(r.returncode, r.stdout, r.stderr, args)
    assert res.rc >= 0, f"killed by signal {-res.rc} (a crash, not an error exit)\n{res}"
    if check is not None:
        assert res.rc == check, str(res)
    return res


@pytest.fixture(scope="session")
def fp4moe_bin():
    return tool_path()


@pytest.fixture(scope="session")
def run_tool():
    return run


@pytest.fixture(scope="session")
def gen_cache(tmp_path_factory):
    return {"root": tmp_path_factory.mktemp("gen"), "dirs": {}}


@pytest.fixture(scope="session")
def gen_tiny(gen_cache):
    """gen_tiny(fmt="modelopt", act="none", shard_size=None, seed=0, topk=None) -> path of a
    generated tiny model, shared by the session (copy it before modifying)."""
    def make(fmt="modelopt", act="none", shard_size=None, seed=0, topk=None):
        key = (fmt, act, shard_size, seed, topk)
        if key not in gen_cache["dirs"]:
            d = gen_cache["root"] / f"tiny-{fmt}-{act}-{shard_size or 'one'}-{seed}-{topk or 'd'}"
            args = ["gen", d, "--preset", "tiny", "--format", fmt, "--act-scheme", act, "--seed", seed]
            if shard_size:
                args += ["--shard-size", shard_size]
            if topk:
                args += ["--topk", topk]
            run(*args, check=0)
            gen_cache["dirs"][key] = d
        return gen_cache["dirs"][key]
    return make


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---- files -------------------------------------------------------------------------------

def tree_hashes(d):
    """{relative path: sha256} of every file under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def read_st(path):
    """Every tensor of a safetensors file through the python package: {name: np.ndarray}
    (F8_E4M3 as ml_dtypes float8_e4m3fn, F8_E8M0 as uint8 codes, BF16 as ml_dtypes bfloat16)."""
    with open(path, "rb") as f:
        items = safetensors.deserialize(f.read())
    out = {}
    for name, t in items:
        arr = np.frombuffer(bytes(t["data"]), dtype=ST_NP[t["dtype"]]).reshape(t["shape"])
        out[name] = arr
    return out


def st_header(path):
    """(header length, header dict, data start) of a safetensors file, parsed by hand."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
    return n, h, 8 + n


def model_shards(d):
    """Shard file names of a model directory (index order, or the single file)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        wm = json.load(open(idx))["weight_map"]
        return sorted(set(wm.values())), wm
    return ["model.safetensors"], None


# ---- codecs (DESIGN.md section 2) ---------------------------------------------------------

def e2m1_decode(codes):
    c = np.asarray(codes, np.uint8)
    v = E2M1_GRID[c & 7]
    return np.where(c & 8, -v, v)


def unpack_e2m1(packed):
    """[N, K/2] uint8 -> [N, K] codes, element 2j in the low nibble."""
    p = np.asarray(packed, np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def nvfp4_dequant(packed, scales, global_scale):
    """float64 [N, K] = e2m1 * e4m3 block scale (per 16 along K) * global decode scale."""
    q = e2m1_decode(unpack_e2m1(packed))
    s = np.asarray(scales).view(E4).astype(np.float64)
    return q * np.repeat(s, 16, axis=-1) * np.float64(global_scale)


def nvfp4_quant(x, g):
    """float32 rows -> (packed uint8 [.., K/2], e4m3 scales as uint8 [.., K/16]) with global
    decode scale g: scale = e4m3_rne(amax/6/g) (saturating at 448), q = e2m1_rne(x/(scale*g));
    a block whose scale is 0 is all zeros. All arithmetic in float32, as the format's
    reference encoders do."""
    x = np.asarray(x, np.float32)
    g = np.float32(g)
    shp = x.shape
    xb = x.reshape(-1, 16)
    amax = np.max(np.abs(xb), axis=1)
    s = np.minimum((amax / np.float32(6)) / g, np.float32(448)).astype(np.float32).astype(E4)
    scale = s.astype(np.float32) * g
    zero = scale == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (xb / np.where(zero, np.float32(1), scale)[:, None]).astype(np.float32)
    y = np.clip(y, -6, 6)
    q = y.astype(F4).view(np.uint8) & 0xF
    q[zero] = 0
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed.reshape(shp[:-1] + (shp[-1] // 2,)), s.view(np.uint8).reshape(shp[:-1] + (shp[-1] // 16,))


def mxfp8_quant(x):
    """float32 rows -> (e4m3 codes uint8 [.., K], ue8m0 scale codes uint8 [.., K/32]): the
    smallest power-of-two scale with amax/scale <= 448."""
    x = np.asarray(x, np.float32)
    shp = x.shape
    xb = x.reshape(-1, 32).astype(np.float64)
    amax = np.max(np.abs(xb), axis=1)
    with np.errstate(divide="ignore"):
        k = np.ceil(np.log2(np.maximum(amax, 1e-30) / 448)).astype(np.int64)
    k = np.where(amax / np.ldexp(1.0, k) > 448, k + 1, k)
    k = np.where(amax / np.ldexp(1.0, k - 1) <= 448, k - 1, k)
    k = np.clip(k, -127, 127)
    q = (xb / np.ldexp(1.0, k)[:, None]).astype(np.float32).astype(E4)
    return q.view(np.uint8).reshape(shp), (k + 127).astype(np.uint8).reshape(shp[:-1] + (shp[-1] // 32,))


def mxfp8_dequant(codes, scales):
    q = np.asarray(codes).view(E4).astype(np.float64)
    s = np.ldexp(1.0, np.asarray(scales, np.int64) - 127)
    return q * np.repeat(s, 32, axis=-1)
