"""Cross-check of the scalar codecs in src/formats.c against ml_dtypes and numpy.

The C side is reached through the helper build/helpers/codec_dump (tests/helpers/codec_dump.c).
References: ml_dtypes float4_e2m1fn, float8_e4m3fn, float8_e8m0fnu, bfloat16 (all round to
nearest even), and a numpy + ml_dtypes transcription of the NVFP4 / MXFP8 block formulas of
DESIGN.md section 2.

Where our encoders deliberately differ from ml_dtypes (each is tested on its own below):
  - e4m3: |x| > 464 (and +-Inf) saturates to +-448 (0x7e / 0xfe); ml_dtypes gives NaN.
    NaN of either sign encodes as 0x7f; ml_dtypes keeps the sign (0xff for -NaN).
  - e2m1: NaN encodes as +0 (0x0); ml_dtypes gives 0x8. (Both saturate finite overflow and Inf.)
  - ue8m0_from_float rounds *up* to a power of two (a scale must not be too small); ml_dtypes
    rounds to nearest, so only exact powers of two are compared with it; x <= 2^-127 -> 0x00,
    x > 2^127 -> 0xfe (ml_dtypes: NaN for 0 and negatives).
"""
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

F4 = ml_dtypes.float4_e2m1fn
E4 = ml_dtypes.float8_e4m3fn
E8 = ml_dtypes.float8_e8m0fnu
BF = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def dump():
    build = os.environ.get("FP4MOE_BUILD")
    assert build, "FP4MOE_BUILD must name the build directory"
    exe = os.path.join(build, "helpers", "codec_dump")
    assert os.access(exe, os.X_OK), f"{exe} is missing: build the codec_dump target"

    def run(*args):
        res = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"codec_dump {args} failed: {res.stderr}"
        return res.stdout

    return run


def bits32(a):
    return np.asarray(a, np.float32).view(np.uint32)


def assert_same_floats(got, want, what):
    """Bit-identical float32 arrays, except that any NaN matches any NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(got) & np.isnan(want)
    bad = np.nonzero((bits32(got) != bits32(want)) & ~nan)[0]
    assert bad.size == 0, f"{what}: {bad.size} mismatches, first at {bad[:5]}: " \
        f"got {got[bad[:5]]} want {want[bad[:5]]}"


def assert_same_codes(x, got, want, what):
    bad = np.nonzero(np.asarray(got) != np.asarray(want))[0]
    assert bad.size == 0, f"{what}: {bad.size} mismatches; x={x[bad[:5]]!r} " \
        f"(hex {[float(v).hex() for v in x[bad[:5]]]}) got {got[bad[:5]]} want {want[bad[:5]]}"


# ---- decode: every code point ------------------------------------------------------------

def test_decode_every_code_point(dump):
    table = {"e2m1": {}, "e4m3": {}, "ue8m0": {}}
    for line in dump("decode").splitlines():
        fmt, code, val = line.split()
        table[fmt][int(code)] = np.float32(np.nan if val == "nan" else float.fromhex(val))
    for fmt, dtype, count in (("e2m1", F4, 16), ("e4m3", E4, 256), ("ue8m0", E8, 256)):
        assert sorted(table[fmt]) == list(range(count)), f"{fmt}: codes printed"
        got = np.array([table[fmt][c] for c in range(count)], np.float32)
        want = np.arange(count, dtype=np.uint8).view(dtype).astype(np.float32)
        assert_same_floats(got, want, f"{fmt} decode")


def test_bf16_decode_every_pattern(dump, tmp_path):
    out = tmp_path / "bf16.bin"
    dump("bf16_decode", out)
    got = np.fromfile(out, np.float32)
    want = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BF).astype(np.float32)
    assert got.size == 65536
    assert_same_floats(got, want, "bf16 decode")
    assert np.array_equal(bits32(got), np.arange(65536, dtype=np.uint32) << 16)


# ---- encode: a large sweep ---------------------------------------------------------------

def midpoints(dtype, codes):
    """Exact midpoints of adjacent positive codes, and the floats just either side."""
    v = np.array(codes, np.uint8).view(dtype).astype(np.float64)
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    return np.concatenate([mid, np.nextafter(mid, np.float32(0)),
                           np.nextafter(mid, np.float32(np.inf))])


def sweep_values():
    rng = np.random.default_rng(1234)
    all_bf16 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    bf16_low = ((np.arange(65536, dtype=np.uint32) << 16)
                | rng.integers(0, 65536, 65536, dtype=np.uint32)).view(np.float32)
    bf16_ties = ((np.arange(65536, dtype=np.uint32) << 16) | 0x8000).view(np.float32)
    bf16_near = np.concatenate([bf16_ties.view(np.uint32) - 1,
                                bf16_ties.view(np.uint32) + 1]).view(np.float32)
    random = np.concatenate([
        rng.standard_normal(100000) * 10.0 ** rng.uniform(-12, 4, 100000),
        rng.uniform(-500, 500, 50000),
        rng.uniform(-8, 8, 50000),
    ]).astype(np.float32)
    ties = np.concatenate([midpoints(F4, range(8)), midpoints(E4, range(0x7f))])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235e38, 1e-45,
                        2.0 ** -127, 2.0 ** -126, 2.0 ** 127, 448, 464, 465, 6, 7],
                       np.float32)
    x = np.concatenate([all_bf16, bf16_low, bf16_ties, bf16_near, random, ties, -ties, special])
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def encoded(dump, tmp_path_factory):
    x = sweep_values()
    d = tmp_path_factory.mktemp("enc")
    x.tofile(d / "x.bin")
    dump("encode", d / "x.bin", d / "codes.bin")
    raw = np.fromfile(d / "codes.bin", np.uint8)
    n = x.size
    assert raw.size == 5 * n
    return x, {"e2m1": raw[:n], "e4m3": raw[n:2 * n], "ue8m0": raw[2 * n:3 * n],
               "bf16": raw[3 * n:].view(np.uint16)}


def test_e2m1_encode_matches_ml_dtypes(encoded):
    x, c = encoded
    ok = ~np.isnan(x)  # ml_dtypes saturates finite overflow and Inf as we do
    want = x[ok].astype(F4).view(np.uint8) & 0xF
    assert_same_codes(x[ok], c["e2m1"][ok], want, "e2m1 encode")
    assert np.all(c["e2m1"][~ok] == 0x0), "e2m1: NaN must encode as +0"
    assert np.all(c["e2m1"] <= 0xF)


def test_e4m3_encode_matches_ml_dtypes(encoded):
    x, c = encoded
    ok = ~np.isnan(x) & (np.abs(x) <= 464)  # ml_dtypes' finite range after RNE
    want = x[ok].astype(E4).view(np.uint8)
    assert_same_codes(x[ok], c["e4m3"][ok], want, "e4m3 encode")


def test_e4m3_saturation_and_nan(encoded):
    x, c = encoded
    big = ~np.isnan(x) & (np.abs(x) > 464)
    assert big.sum() > 1000
    want = np.where(np.signbit(x[big]), 0xFE, 0x7E).astype(np.uint8)
    assert_same_codes(x[big], c["e4m3"][big], want, "e4m3 saturation")
    assert np.all(c["e4m3"][np.isnan(x)] == 0x7F), "e4m3: NaN must encode as 0x7f"
    # inside (448, 464] ml_dtypes and we agree (RNE to 448): covered above; check it is hit
    assert np.any((np.abs(x) > 448) & (np.abs(x) <= 464))


def test_bf16_encode_matches_ml_dtypes(encoded):
    x, c = encoded
    ok = ~np.isnan(x)
    want = x[ok].astype(BF).view(np.uint16)
    assert_same_codes(x[ok], c["bf16"][ok], want, "bf16 encode")
    got_nan = c["bf16"][~ok]
    assert np.all(((got_nan & 0x7F80) == 0x7F80) & ((got_nan & 0x7F) != 0)), "bf16 NaN"


def test_ue8m0_encode(encoded):
    x, c = encoded
    got = c["ue8m0"]
    with np.errstate(invalid="ignore"):
        x64 = x.astype(np.float64)
    # exact powers of two in range: the same as ml_dtypes (no rounding involved)
    m, e = np.frexp(np.where(np.isfinite(x64), x64, 0.0))
    pow2 = (m == 0.5) & (x64 >= 2.0 ** -127) & (x64 <= 2.0 ** 127)
    assert pow2.sum() > 200
    want = x[pow2].astype(E8).view(np.uint8)
    assert_same_codes(x[pow2], got[pow2], want, "ue8m0 encode of powers of two")
    # everything else: the smallest power of two >= x, clamped to [2^-127, 2^127]
    inr = (x64 > 2.0 ** -127) & (x64 <= 2.0 ** 127)
    k = got[inr].astype(np.int64) - 127
    assert np.all(np.ldexp(1.0, k) >= x64[inr]) and np.all(np.ldexp(1.0, k - 1) < x64[inr]), \
        "ue8m0: not the smallest power of two >= x"
    low = x64 <= 2.0 ** -127  # zeros, negatives, -Inf, tiny
    assert np.all(got[low] == 0x00)
    high = x64 > 2.0 ** 127
    assert np.all(got[high] == 0xFE)
    assert np.all(got[np.isnan(x)] == 0xFF)


# ---- NVFP4 / MXFP8 block quantization -----------------------------------------------------

def nvfp4_reference(x, g):
    """DESIGN.md section 2 in float32: scale = e4m3(amax/6/g) (saturating),
    q = e2m1_rne(x / (scale*g)), zeros where the block scale is 0."""
    g = np.float32(g)
    xb = x.reshape(-1, 16)
    amax = np.max(np.abs(xb), axis=1)
    s = (amax / np.float32(6) / g).astype(np.float32)
    s = np.minimum(s, np.float32(448)).astype(E4)  # saturate, then RNE
    scale = s.astype(np.float32) * g
    zero = scale == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        y = xb / np.where(zero, np.float32(1), scale)[:, None]
    q = y.astype(F4).view(np.uint8) & 0xF
    q[zero] = 0
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    deq = (q.view(F4).astype(np.float32) * s.astype(np.float32)[:, None]) * g
    return packed, s.view(np.uint8), deq.reshape(-1).astype(np.float32)


def nvfp4_cases():
    rng = np.random.default_rng(99)
    blocks = 512
    gauss = rng.standard_normal(blocks * 16).astype(np.float32)
    gauss *= np.repeat(10.0 ** rng.uniform(-3, 1, blocks), 16).astype(np.float32)
    heavy = rng.standard_t(2, blocks * 16).astype(np.float32)
    sparse = gauss * (rng.random(blocks * 16) < 0.3)
    sparse[:64] = 0  # whole zero blocks
    tiny = (rng.standard_normal(blocks * 16) * 1e-6).astype(np.float32)  # scales round to 0
    cases = []
    for name, x in (("gauss", gauss), ("heavy", heavy), ("sparse", sparse), ("tiny", tiny)):
        amax = float(np.max(np.abs(x))) or 1.0
        for g in (amax / (6 * 448), np.float32(1.0), np.float32(0.0123), amax / (6 * 448) / 4):
            cases.append((name, x, np.float32(g)))
    return cases


@pytest.mark.parametrize("case", range(16))
def test_nvfp4_matches_numpy_reference(dump, tmp_path, case):
    name, x, g = nvfp4_cases()[case]
    x.tofile(tmp_path / "x.bin")
    dump("nvfp4", tmp_path / "x.bin", tmp_path / "o.bin", float(g).hex())
    raw = np.fromfile(tmp_path / "o.bin", np.uint8)
    n = x.size
    packed, scales = raw[:n // 2], raw[n // 2:n // 2 + n // 16]
    deq = raw[n // 2 + n // 16:].view(np.float32)
    rp, rs, rd = nvfp4_reference(x, g)
    what = f"nvfp4 {name} global {float(g).hex()}"
    assert_same_codes(np.arange(rs.size), scales, rs, what + " scales")
    assert_same_codes(np.arange(rp.size), packed, rp, what + " packed")
    assert_same_floats(deq, rd, what + " dequantized")
    if g == np.float32(float(np.max(np.abs(x))) / (6 * 448)) and name == "gauss":
        rel = np.linalg.norm(deq - x) / np.linalg.norm(x)
        assert rel < 0.15, f"{what}: relative error {rel}"


def mxfp8_reference(x):
    """Smallest power-of-two scale 2^k (k in [-127, 127]) with amax / 2^k <= 448, found by
    exact float64 comparisons; q = e4m3_rne(x / 2^k)."""
    xb = x.reshape(-1, 32)
    amax = np.max(np.abs(xb), axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        k = np.clip(np.ceil(np.log2(amax / 448)), -127, 127).astype(np.int64)  # estimate
    for _ in range(2):  # make it exact: log2 in floating point may be off by one
        k = np.where((amax / np.ldexp(1.0, k) > 448) & (k < 127), k + 1, k)
        k = np.where((amax / np.ldexp(1.0, k - 1) <= 448) & (k > -127), k - 1, k)
    scale = np.ldexp(np.float32(1), k.astype(np.int32)).astype(np.float32)
    q = (xb / scale[:, None]).astype(np.float32).astype(E4)
    deq = q.astype(np.float32) * scale[:, None]
    return q.view(np.uint8).reshape(-1), (k + 127).astype(np.uint8), deq.reshape(-1)


def test_mxfp8_matches_numpy_reference(dump, tmp_path):
    rng = np.random.default_rng(7)
    blocks = 2048
    x = rng.standard_normal(blocks * 32) * np.repeat(10.0 ** rng.uniform(-30, 30, blocks), 32)
    x = x.astype(np.float32)
    x[:32] = 0
    x[32:64] = 448.0 * 2.0 ** -3  # exactly on a power-of-two boundary
    x.tofile(tmp_path / "x.bin")
    dump("mxfp8", tmp_path / "x.bin", tmp_path / "o.bin")
    raw = np.fromfile(tmp_path / "o.bin", np.uint8)
    n = x.size
    q, scales = raw[:n], raw[n:n + n // 32]
    deq = raw[n + n // 32:].view(np.float32)
    rq, rs, rd = mxfp8_reference(x)
    assert_same_codes(np.arange(blocks), scales, rs, "mxfp8 scales")
    assert_same_codes(x, q, rq, "mxfp8 codes")
    assert_same_floats(deq, rd, "mxfp8 dequantized")
    assert scales[1] == 127 - 3
