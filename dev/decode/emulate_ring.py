"""emulate_ring.py - host emulation of the cp.async ring of w4a16_decode.cu's NVFP4 main loop
(lab check, no GPU). For every warp of a block it replays the copy roles (lane -> weight row,
16-byte chunk, scale word, shared-memory destination), the ring stage arithmetic and the
commit / wait_group<RING-2> / __syncwarp order, with copies landing as early (at issue) or as
late (at the wait) as the PTX rules allow, and checks that every lane's shared-memory reads
(weights 8 bytes at row 16r+g / 16r+8+g, byte 8t; scale words) equal what the previous kernel
loaded straight from global memory (rows rlo / rhi of fp4_dec_kernel, zeros for missing tiles).
Run: python3 dev/decode/emulate_ring.py  (prints 'N passed, M failed')."""
import sys
import numpy as np

RING_GROUPS, WARPS = 8, 8
rng = np.random.default_rng(7)
passed = failed = 0


def check_block(gated, KS, RT, n, k, E, expert, by, landing):
    global passed, failed
    RW = WARPS // KS
    RING, RR = RING_GROUPS // RT, 16 * RT
    n_tiles = n // 8 if gated else n // 16
    n_wrows = 2 * n if gated else n
    wq = rng.integers(0, 256, E * n_wrows * k // 2, dtype=np.uint8)
    ws = rng.integers(0, 256, E * n_wrows * k // 16, dtype=np.uint8)
    ngr = k >> 6
    bad = 0
    for warp in range(WARPS):
        ks, rw = warp % KS, warp // KS
        gb0, gb1 = ngr * ks // KS, ngr * (ks + 1) // KS
        tile0 = (by * RW + rw) * RT
        tok = [tile0 + r < n_tiles for r in range(RT)]

        def wrow(r, h, gg):
            tt = tile0 + r if tile0 + r < n_tiles else 0
            return expert * n_wrows + (h * n + 8 * tt + gg if gated else 16 * tt + 8 * h + gg)

        wsm = np.full(RING * RR * 32, 0xEE, np.uint8)  # poison
        ssm = np.full(RING * RR * 4, 0xEE, np.uint8)
        ng = gb1 - gb0
        pending = []  # committed groups not yet landed: lists of (dst array, off, bytes)

        def issue(i):
            copies = []
            if i < ng:
                gi, st = gb0 + i, i & (RING - 1)
                for lane in range(32):
                    for j in range(RT):
                        src = wrow(j, lane >> 4, (lane >> 1) & 7) * (k // 2) + 16 * (lane & 1) + 32 * gi
                        dst = st * RR * 32 + j * 512 + (lane >> 1) * 32 + 16 * (lane & 1)
                        data = wq[src:src + 16] if tok[j] else np.zeros(16, np.uint8)
                        copies.append((wsm, dst, data.copy()))
                    if lane < RR:
                        sr = lane & (RR - 1)
                        src = wrow(sr >> 4, (sr >> 3) & 1, sr & 7) * (k // 16) + 4 * gi
                        ok = tile0 + (sr >> 4) < n_tiles
                        data = ws[src:src + 4] if ok else np.zeros(4, np.uint8)
                        copies.append((ssm, st * RR * 4 + sr * 4, data.copy()))
            if landing == 'early':
                for a, o, d in copies:
                    a[o:o + len(d)] = d
                copies = []
            pending.append(copies)

        def wait(N):
            while len(pending) > N:
                for a, o, d in pending.pop(0):
                    a[o:o + len(d)] = d

        for i in range(RING - 1):
            issue(i)
        for i in range(ng):
            wait(RING - 2)
            issue(i + RING - 1)
            gi, st = gb0 + i, i & (RING - 1)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for r in range(RT):
                    for h in range(2):
                        row = 16 * r + 8 * h + g
                        got_w = wsm[st * RR * 32 + row * 32 + 8 * t: st * RR * 32 + row * 32 + 8 * t + 8]
                        got_s = ssm[st * RR * 4 + row * 4: st * RR * 4 + row * 4 + 4]
                        if tok[r]:
                            R = wrow(r, h, g)
                            ref_w = wq[R * (k // 2) + 32 * gi + 8 * t: R * (k // 2) + 32 * gi + 8 * t + 8]
                            ref_s = ws[R * (k // 16) + 4 * gi: R * (k // 16) + 4 * gi + 4]
                        else:
                            ref_w, ref_s = np.zeros(8, np.uint8), np.zeros(4, np.uint8)
                        if not (np.array_equal(got_w, ref_w) and np.array_equal(got_s, ref_s)):
                            bad += 1
        if any(len(c) for c in pending):  # a copy still in flight when the warp leaves
            bad += 1
    name = f"gated={gated} KS={KS} RT={RT} n={n} k={k} E={E} expert={expert} by={by} landing={landing}"
    if bad:
        failed += 1
        print(f"FAIL ring {name}: {bad} mismatched reads")
    else:
        passed += 1


for landing in ('late', 'early'):
    # FC1 (gated, K = H split over 8 warps) and FC2 (plain, short K whole per warp), RT 1 / 2,
    # a partial last block of tiles, K not a multiple of 256 (scale rows not 16-aligned)
    for gated, KS, RT, n, k in [(1, 8, 1, 48, 1024), (1, 8, 2, 40, 1024), (1, 8, 1, 24, 1088),
                                (0, 1, 1, 256, 384), (0, 1, 2, 272, 384), (0, 1, 1, 48, 64),
                                (0, 1, 2, 16, 192), (1, 1, 1, 16, 320), (0, 8, 1, 32, 1024)]:
        RW = WARPS // KS
        n_tiles = n // 8 if gated else n // 16
        nby = -(-n_tiles // (RW * RT))
        for by in sorted({0, nby - 1}):
            check_block(gated, KS, RT, n, k, 3, 2, by, landing)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
