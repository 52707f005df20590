"""bench/summarize.py over raw files committed in bench/results: the tables of RESULTS.md come
from it, so its numbers are checked here against the JSON they come from (computed again in
the test), and its errors on bad input name the file."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

SRC = os.environ.get("FP4MOE_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
TOOL = os.path.join(SRC, "bench", "summarize.py")
RES = os.path.join(SRC, "bench", "results")
FINAL = os.path.join(RES, "2026-12-01-s33-c2-final.json")
HUM8 = os.path.join(RES, "2026-12-01-s33-c3-humming_i384_k8.json")
HUM4 = os.path.join(RES, "2026-12-01-s33-c3-humming_i384_k4.json")
PREV = os.path.join(RES, "2026-12-01-s32-c3-final.json")
AB = os.path.join(RES, "2026-12-01-s33-c6-ab-topk-split.tgz")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def test_table_rows_match_the_json():
    r = run("table", FINAL, HUM8, HUM4, PREV, "--prev-label", "earlier")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    fin = json.load(open(FINAL))
    hum = {}
    for path in (HUM8, HUM4):
        h = json.load(open(path))
        for x in h["results"]:
            hum[(h["meta"]["topk"], x["M"])] = x["time_us"]
    prev = {(x["topk"], x["m"]): x["us"] for x in json.load(open(PREV))["results"]}
    assert lines[0] == (f"copy {fin['copy_GBps']:.0f} GB/s, "
                        f"cuBLAS {fin['cublas_peak_TFLOPs']:.0f} TFLOP/s")
    assert lines[1].endswith("| experts / Humming | earlier |")
    rows = lines[3:]
    assert len(rows) == len(fin["results"])
    for line, x in zip(rows, fin["results"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        k, m = x["topk"], x["m"]
        assert cells[:4] == [str(k), str(m), f"{m * k / x['experts']:g}", x["kernel"]]
        assert float(cells[4]) == pytest.approx(x["us"], abs=0.05)
        assert float(cells[6]) == pytest.approx(x["experts_us"], abs=0.05)
        assert float(cells[7]) == pytest.approx(x["x_floor"], abs=0.005)
        assert float(cells[8]) == pytest.approx(hum[(k, m)], abs=0.05)
        assert float(cells[9]) == pytest.approx(x["experts_us"] / hum[(k, m)], abs=0.005)
        assert float(cells[10]) == pytest.approx(prev[(k, m)], abs=0.05)


def test_ab_percentages_match_the_json(tmp_path):
    with tarfile.open(AB) as t:
        t.extractall(tmp_path)
    r = run("ab", str(tmp_path), "build-main", "build-notopk")
    assert r.returncode == 0, r.stderr
    runs = {}
    for name in os.listdir(tmp_path):
        if name.endswith(".json"):
            build = name.split("__")[2]
            for x in json.load(open(tmp_path / name))["results"]:
                runs.setdefault((build, x["topk"], x["inter"], x["m"]), []).append(x["us"])
    lines = r.stdout.splitlines()[1:]
    assert len(lines) == len([k for k in runs if k[0] == "build-main"])
    for line in lines:
        k, i, m, _, base, rest = line.split(None, 5)
        key = (int(k), int(i), int(m))
        b = runs[("build-main",) + key]
        n = runs[("build-notopk",) + key]
        assert float(base) == pytest.approx(sum(b) / len(b), abs=0.05)
        pct = 100 * (sum(n) / len(n) / (sum(b) / len(b)) - 1)
        assert float(rest.split("(")[0]) == pytest.approx(pct, abs=0.05)
        assert float(rest.split("(")[1].rstrip(")")) == pytest.approx(
            100 * (max(n) / min(n) - 1), abs=0.05)


def test_bad_input_names_the_file(tmp_path):
    r = run("table", str(tmp_path / "none.json"), HUM8, HUM4)
    assert r.returncode == 2 and "none.json" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = run("table", FINAL, str(bad), HUM4)
    assert r.returncode == 2 and "bad.json" in r.stderr and "not JSON" in r.stderr
    r = run("ab", str(tmp_path), "build-main")
    assert r.returncode == 2 and "no ab__*.json" in r.stderr
    with tarfile.open(AB) as t:
        t.extractall(tmp_path)
    r = run("ab", str(tmp_path), "build-nothere")
    assert r.returncode == 2 and "build-nothere" in r.stderr and "build-main" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and "usage" in r.stderr
