#!/usr/bin/env python3
"""Tables for bench/RESULTS.md from the raw files of a device call (standard library only).

  bench/summarize.py ab DIR BASE [BUILD ...]
      The JSON files of bench/ab_many.sh in DIR (ab__TAG__BUILD__PASS.json, unpacked from its
      archive): per problem, BASE's mean layer us over the passes and, for each BUILD (default:
      every other build found), its mean against BASE's in % and the spread of its passes
      (largest / smallest - 1, in %) in parentheses.
  bench/summarize.py table FINAL HUMMING_K8 HUMMING_K4 [PREV] [--prev-label TEXT]
      The final table: FINAL is `fp4moe bench --json` over bench/problems_final.txt, the
      HUMMING files the peer's JSON (bench/peer, one per top-k), PREV an earlier FINAL for the
      last column. Sizes without a peer or earlier number get empty cells.
Exit status 2 with a message naming the file on bad input.
"""
import collections
import glob
import json
import os
import re
import sys


def fail(msg):
    print(f"summarize.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"cannot read {what} '{path}': {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{what} '{path}' is not JSON: {e}")


def results_of(doc, path, keys):
    rows = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        fail(f"'{path}' has no 'results' list")
    for r in rows:
        missing = [k for k in keys if k not in r]
        if missing:
            fail(f"'{path}': a result lacks {', '.join(missing)}")
    return rows


BENCH_KEYS = ("topk", "inter", "m", "kernel", "us")


def ab(argv):
    if len(argv) < 2:
        fail("usage: ab DIR BASE [BUILD ...]")
    d, base = argv[0], argv[1]
    data = collections.defaultdict(lambda: collections.defaultdict(list))
    files = sorted(glob.glob(os.path.join(d, "ab__*.json")))
    if not files:
        fail(f"no ab__*.json files in '{d}'")
    for f in files:
        m = re.match(r"ab__(.+)__(.+)__(\d+)\.json$", os.path.basename(f))
        if not m:
            fail(f"'{f}': expected a name ab__TAG__BUILD__PASS.json")
        build = m.group(2)
        for r in results_of(load(f, "A/B result"), f, BENCH_KEYS):
            data[build][(r["topk"], r["inter"], r["m"], r["kernel"])].append(r["us"])
    if base not in data:
        fail(f"no build '{base}' in '{d}' (found: {', '.join(sorted(data))})")
    builds = argv[2:] or sorted(b for b in data if b != base)
    for b in builds:
        if b not in data:
            fail(f"no build '{b}' in '{d}' (found: {', '.join(sorted(data))})")
    out = [f"{'k':>2} {'I':>5} {'M':>6} {'kernel':11} {'base us':>8} " +
           " ".join(f"{b[:13]:>13}" for b in builds)]
    for key in sorted(data[base], key=lambda k: (k[1], -k[0], k[2])):
        bl = data[base][key]
        bu = sum(bl) / len(bl)
        row = f"{key[0]:>2} {key[1]:>5} {key[2]:>6} {key[3]:11} {bu:8.1f} "
        for b in builds:
            l = data[b].get(key)
            if not l:
                row += f"{'-':>13} "
                continue
            u = sum(l) / len(l)
            row += f"{100 * (u / bu - 1):+6.1f}({100 * (max(l) / min(l) - 1):4.1f}) "
        out.append(row.rstrip())
    return out


def table(argv):
    label = "layer, earlier final"
    if "--prev-label" in argv:
        i = argv.index("--prev-label")
        if i + 1 >= len(argv):
            fail("--prev-label needs a text")
        label = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if len(argv) not in (3, 4):
        fail("usage: table FINAL HUMMING_K8 HUMMING_K4 [PREV] [--prev-label TEXT]")
    fin = load(argv[0], "final table")
    rows = results_of(fin, argv[0], BENCH_KEYS + ("experts", "prologue_us", "experts_us",
                                                  "x_floor"))
    for k in ("copy_GBps", "cublas_peak_TFLOPs"):
        if k not in fin:
            fail(f"'{argv[0]}' lacks '{k}'")
    hum = {}
    for path in argv[1:3]:
        h = load(path, "Humming result")
        topk = h.get("meta", {}).get("topk") if isinstance(h, dict) else None
        if topk is None:
            fail(f"'{path}' has no meta.topk")
        for r in results_of(h, path, ("M", "time_us")):
            hum[(topk, r["M"])] = r["time_us"]
    prev = {}
    if len(argv) == 4:
        for r in results_of(load(argv[3], "earlier final table"), argv[3], BENCH_KEYS):
            prev[(r["topk"], r["m"])] = r["us"]
    out = [f"copy {fin['copy_GBps']:.0f} GB/s, cuBLAS {fin['cublas_peak_TFLOPs']:.0f} TFLOP/s",
           "| top-k | M | rows / expert | kernel | us (layer) | prologue us | experts us | "
           f"layer x floor | Humming us | experts / Humming | {label} |",
           "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        k, m = r["topk"], r["m"]
        h, p = hum.get((k, m)), prev.get((k, m))
        hus = f"{h:.1f}" if h else ""
        ratio = f"{r['experts_us'] / h:.2f}" if h else ""
        pus = f"{p:.1f}" if p else ""
        out.append(f"| {k} | {m} | {m * k / r['experts']:g} | {r['kernel']} | {r['us']:.1f} | "
                   f"{r['prologue_us']:.1f} | {r['experts_us']:.1f} | {r['x_floor']:.2f} | "
                   f"{hus} | {ratio} | {pus} |")
    return out


def main(argv):
    if not argv or argv[0] not in ("ab", "table"):
        fail("usage: summarize.py ab DIR BASE [BUILD ...] | table FINAL HUMMING_K8 HUMMING_K4 "
             "[PREV] [--prev-label TEXT]")
    print("\n".join(ab(argv[1:]) if argv[0] == "ab" else table(argv[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
