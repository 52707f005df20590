"""emulate_layout.py - host emulation of w4a16_decode.cu's fragment bookkeeping for one
64-element K group (lab check, no GPU): permuted NVFP4 bytes (fp4_mma_permute_row), nibble-pair
extraction, e4m3 scale conversion, the paired activation layout (fp4_dec_prep and
fp4_dec_pair_pos) and the m16n8k16 fragment maps; compares C with a plain dot product."""
import numpy as np
import struct

rng = np.random.default_rng(1)
E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6]

def bf16_val(bits):
    return struct.unpack('<f', struct.pack('<I', (bits & 0xffff) << 16))[0]

def e4m3_val(c):
    s = -1 if c & 0x80 else 1
    e, m = (c >> 3) & 15, c & 7
    return s * (m / 8 * 2**-6 if e == 0 else (1 + m / 8) * 2**(e - 7))

def permute(src):  # one 32-byte group
    dst = [0] * 32
    for t in range(4):
        for j in range(4):
            for h in range(2):
                dst[8 * t + 2 * j + h] = src[8 * j + t + 4 * h]
    return dst

def e2m1_pair(q, p):
    a = (q << (12 - 4 * p)) & 0xffffffff
    return (a & 0x80008000) | ((a >> 6) & 0x01c001c0)

def bmul(a, b):  # bf16x2 multiply, values (exact here)
    return (bf16_val(a) * bf16_val(b), bf16_val(a >> 16) * bf16_val(b >> 16))

def scales(v):
    e = ((v & 0x007f007f) << 4) | ((v & 0x00800080) << 8)
    o = ((v >> 4) & 0x07f007f0) | (v & 0x80008000)
    # two exact power-of-2 products: value * 2^239
    ev = [bf16_val(e) * 2.0**239, bf16_val(e >> 16) * 2.0**239]
    ov = [bf16_val(o) * 2.0**239, bf16_val(o >> 16) * 2.0**239]
    return (ev[0], ov[0]), (ev[1], ov[1])  # (s0, s1), (s2, s3)

def pair_pos(k):
    r = k & 63; c = r >> 5; q = r & 31; i = q & 15; half = q >> 4
    t = (i & 7) >> 1; w = (i & 1) | ((i >> 3) << 1)
    return (k & ~63) + 2 * (t * 8 + c * 4 + w) + half

def prep_pair(x):  # fp4_dec_prep conversion of one 64-group
    out = [0.0] * 64
    for t in range(4):
        for c in range(2):
            w = lambda j: (x[2 * (16 * c + t + 4 * j)], x[2 * (16 * c + t + 4 * j) + 1])
            v0, v1, v2, v3 = w(0), w(1), w(2), w(3)
            words = [(v0[0], v2[0]), (v0[1], v2[1]), (v1[0], v3[0]), (v1[1], v3[1])]
            for wi, (lo, hi) in enumerate(words):
                out[16 * t + 8 * c + 2 * wi] = lo
                out[16 * t + 8 * c + 2 * wi + 1] = hi
    return out

rows = 16
packed = rng.integers(0, 256, size=(rows, 32))
sc = rng.integers(0, 256, size=(rows, 4)); sc[:, :] &= 0x7f  # positive scales, any exponent
sc[0, 0] = 3  # a subnormal scale code
w = np.zeros((rows, 64))
for r in range(rows):
    for b in range(32):
        for nib in range(2):
            code = (packed[r, b] >> (4 * nib)) & 15
            k = 2 * b + nib
            v = E2M1[code & 7] * (-1 if code & 8 else 1)
            w[r, k] = v * e4m3_val(int(sc[r, k // 16]))
x = rng.standard_normal((8, 64)).astype(np.float32).astype(np.float64)
ref = w @ x.T  # [16, 8]

# paired x two ways must agree
for n in range(8):
    pp = [0.0] * 64
    for k in range(64):
        pp[pair_pos(k)] = x[n, k]
    assert pp == prep_pair(list(x[n])), "pair_pos and prep disagree"
xp = np.array([prep_pair(list(x[n])) for n in range(8)])

C = np.zeros((16, 8))
for c in range(2):
    for step in range(2):
        A = np.zeros((16, 16)); B = np.zeros((16, 8))
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            def word(r):
                pb = permute(list(packed[r]))
                b = pb[8 * t + 4 * c: 8 * t + 4 * c + 4]
                return b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24
            def sv(r):
                v = int(sc[r, 0]) | int(sc[r, 1]) << 8 | int(sc[r, 2]) << 16 | int(sc[r, 3]) << 24
                return scales(v)[c]
            for (row, rr) in ((g, g), (g + 8, g + 8)):
                q = word(rr); s = sv(rr)
                p0, p1 = (0, 1) if step == 0 else (2, 3)
                for (p, kk) in ((p0, 2 * t), (p1, 2 * t + 8)):
                    bits = e2m1_pair(q, p)
                    lo = bf16_val(bits) * s[0]; hi = bf16_val(bits >> 16) * s[1]
                    A[row, kk] = lo; A[row, kk + 1] = hi
            base = 16 * t + 8 * c + (0 if step == 0 else 4)
            B[2 * t, g], B[2 * t + 1, g] = xp[g, base], xp[g, base + 1]
            B[2 * t + 8, g], B[2 * t + 9, g] = xp[g, base + 2], xp[g, base + 3]
        C += A @ B
C *= 2.0**7  # bf16 weights are w * 2^-126, scales s * 2^119: the epilogue undoes 2^-7
err = np.abs(C - ref).max() / np.abs(ref).max()
print("max rel diff", err)
assert err < 1e-12
print("OK")
