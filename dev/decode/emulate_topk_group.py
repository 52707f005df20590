"""emulate_topk_group.py - host emulation of fp4_dec_topk_group_kernel (w4a16_decode.cu) against
the previous algorithm (lab check, no GPU). New: per token one warp, per pick each lane's best
untaken candidate by selection key (score_key: -0 == +0, NaN lowest), then warp max of the key
and warp min of the id; 64-bit token masks per expert; warp-scan prefix of the slot counts;
a pair's row = its expert's first row + rank of its token among the expert's tokens. Old: k
passes of "best by route_better (larger score, ties to the lower id)", counts, thread 0's
serial prefix, atomics (order inside a segment arbitrary: compared as sets). Checks ids, w
(bit-exact, float32), tile_expert, row_src / row_dst / row_w per slot segment, and that the
new order inside a segment is token order. Cases: M 1..64, top-k 1..E (= E), E not a multiple
of 32, E = 256, heavy ties, +-0, -inf, skewed routing with empty experts.
Run: python3 dev/decode/emulate_topk_group.py  (prints 'N passed, M failed')."""
import struct
import sys
import numpy as np

T = 8
rng = np.random.default_rng(11)
passed = failed = 0
f32 = np.float32


def score_key(s):
    s = f32(s)
    if s != s:
        return 1
    s = f32(s + f32(0.0))  # -0 -> +0
    u = struct.unpack('<I', struct.pack('<f', s))[0]
    return (~u) & 0xffffffff if u & 0x80000000 else u | 0x80000000


def topk_old(pv, sv, k, norm, scaling):
    E = len(pv)
    taken = [False] * E
    ids, bps = [], []
    for _ in range(k):
        bs, bi, bp = f32(-np.inf), 0x7fffffff, f32(0)
        for e in range(E):
            if taken[e]:
                continue
            if sv[e] > bs or (sv[e] == bs and e < bi):
                bs, bi, bp = sv[e], e, pv[e]
        taken[bi] = True
        ids.append(bi)
        bps.append(bp)
    return ids, finish(bps, norm, scaling)


def finish(bps, norm, scaling):
    cs = f32(0)
    for b in bps:
        cs = f32(cs + b)
    f = f32(f32(scaling) / cs) if norm and cs > 0 else f32(scaling)
    return [f32(b * f) for b in bps]


def topk_new(pv, sv, k, norm, scaling):
    E, J = len(pv), 8
    key = [[score_key(sv[l + 32 * j]) if l + 32 * j < E else 0 for j in range(J)] for l in range(32)]
    taken = [0] * 32
    ids, bps = [], []
    for _ in range(k):
        loc = []
        for l in range(32):
            bk, bj, bp = 0, 0, f32(0)
            for j in range(J):
                if not (taken[l] >> j) & 1 and key[l][j] > bk:
                    bk, bj, bp = key[l][j], j, pv[l + 32 * j]
            loc.append((bk, bj, bp))
        mk = max(c[0] for c in loc)
        bi = min((l + 32 * loc[l][1]) if loc[l][0] == mk else 0xffffffff for l in range(32))
        bp = loc[bi & 31][2]
        taken[bi & 31] |= 1 << (bi >> 5)
        ids.append(bi)
        bps.append(bp)
    return ids, finish(bps, norm, scaling)


def scan_new(tiles, E):  # warp scans (shfl_up) + per-warp totals, as scan_tiles
    incl = [0] * 256
    wsum = [0] * 8
    for w in range(8):
        vals = [tiles[32 * w + l] if 32 * w + l < E else 0 for l in range(32)]
        cur = vals[:]
        o = 1
        while o < 32:
            cur = [cur[l] + (cur[l - o] if l >= o else 0) for l in range(32)]
            o <<= 1
        incl[32 * w:32 * w + 32] = cur
        wsum[w] = cur[31]
    ts = [0] * (E + 1)
    for e in range(E):
        off = sum(wsum[:e >> 5])
        ts[e] = off + incl[e] - tiles[e]
        if e == E - 1:
            ts[E] = off + incl[e]
    return ts


def slots_of(ts, E, n_slots):
    te = []
    for s in range(n_slots):
        e = -1
        if s < ts[E]:
            lo, hi = 0, E - 1
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if ts[mid] <= s:
                    lo = mid
                else:
                    hi = mid - 1
            e = lo
        te.append(e)
    return te


def group_old(ids, w, m, k, E, n_slots):
    cnt = [0] * E
    for e in ids:
        cnt[e] += 1
    ts, tiles = [], 0
    for e in range(E):
        ts.append(tiles)
        tiles += (cnt[e] + T - 1) // T
    ts.append(tiles)
    rows = [(-1, -1, f32(0))] * (n_slots * T)
    cur = [0] * E
    order = list(range(m * k))
    rng.shuffle(order)  # atomics: any order inside a segment
    for q in order:
        e = ids[q]
        rows[ts[e] * T + cur[e]] = (q // k, q, w[q])
        cur[e] += 1
    return slots_of(ts, E, n_slots), rows, ts


def group_new(ids, w, m, k, E, n_slots):
    mask = [0] * E
    for q, e in enumerate(ids):
        mask[e] |= 1 << (q // k)
    tiles = [(bin(mask[e]).count('1') + T - 1) // T for e in range(E)]
    ts = scan_new(tiles, E)
    rows = [(-1, -1, f32(0))] * (n_slots * T)
    for q, e in enumerate(ids):
        t = q // k
        pos = ts[e] * T + bin(mask[e] & ((1 << t) - 1)).count('1')
        rows[pos] = (t, q, w[q])
    return slots_of(ts, E, n_slots), rows, ts


def check(m, E, k, kind, norm=1, scaling=2.0):
    global passed, failed
    if kind == 'ties':
        sv = rng.integers(-3, 4, (m, E)).astype(f32) * f32(0.25)
        sv[rng.random((m, E)) < 0.1] = f32(-0.0)
        sv[rng.random((m, E)) < 0.05] = f32(-np.inf)
    elif kind == 'skewed':  # a few experts take everything, most are empty
        sv = rng.standard_normal((m, E)).astype(f32)
        sv[:, : max(k, 3)] += f32(10)
    else:
        sv = rng.standard_normal((m, E)).astype(f32)
    pv = (f32(1) / (f32(1) + np.exp(-rng.standard_normal((m, E)).astype(f32)))).astype(f32)
    ids_o, w_o, ids_n, w_n = [], [], [], []
    for t in range(m):
        a, b = topk_old(pv[t], sv[t], k, norm, scaling)
        c, d = topk_new(pv[t], sv[t], k, norm, scaling)
        ids_o += a; w_o += b; ids_n += c; w_n += d
    name = f"m={m} E={E} k={k} kind={kind} norm={norm}"
    errs = []
    if ids_o != ids_n:
        errs.append("ids differ")
    if np.array(w_o, f32).tobytes() != np.array(w_n, f32).tobytes():
        errs.append("w differ")
    n_slots = (m * k + T - 1) // T + E
    te_o, r_o, ts_o = group_old(ids_n, w_n, m, k, E, n_slots)
    te_n, r_n, ts_n = group_new(ids_n, w_n, m, k, E, n_slots)
    if ts_o != ts_n:
        errs.append(f"tstart differ {ts_o[:8]} {ts_n[:8]}")
    if te_o != te_n:
        errs.append("tile_expert differ")
    for e in range(E):
        seg_o = r_o[ts_o[e] * T: ts_o[e + 1] * T]
        seg_n = r_n[ts_n[e] * T: ts_n[e + 1] * T]
        key = lambda r: (r[1], r[0], float(r[2]))
        if sorted(seg_o, key=key) != sorted(seg_n, key=key):
            errs.append(f"segment of expert {e} differs")
            break
        real = [r[1] for r in seg_n if r[1] >= 0]
        if real != sorted(real) or any(r[1] >= 0 for r in seg_n[len(real):]):
            errs.append(f"segment of expert {e} not in token order / not packed")
            break
    if r_o[ts_o[E] * T:] != r_n[ts_n[E] * T:] or any(r != (-1, -1, 0) for r in r_n[ts_n[E] * T:]):
        errs.append("rows past the last slot not empty")
    if errs:
        failed += 1
        print(f"FAIL topk_group {name}: {'; '.join(errs)}")
    else:
        passed += 1


for m in (1, 2, 7, 8, 33, 64):
    for E, k in ((128, 8), (128, 4), (72, 6), (256, 8), (16, 16), (128, 1)):
        for kind in ('normal', 'ties', 'skewed'):
            check(m, E, k, kind)
check(64, 128, 128, 'normal')   # top-k = E
check(64, 128, 128, 'ties')
check(3, 256, 256, 'ties', norm=0, scaling=1.0)
check(64, 40, 40, 'skewed', norm=0)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
