"""End-to-end tests of `fp4moe gen` and `fp4moe inspect` (DESIGN.md sections 2, 3, 5).

What is checked, against the python `safetensors` package and numpy/ml_dtypes:
- gen x inspect --json round trip for preset tiny, every --format x every --act-scheme, sharded
  (small --shard-size) and single-file: layer kinds, expert counts, weight / activation
  schemes as generated (per-token is FC1 only), tensor count and bytes equal what python reads
  from every shard, the index agrees with the shards, names follow each format's spelling;
- the NVFP4 tensors gen wrote dequantize to finite values whose global scale is what gen.c
  documents (amax bound 2*sqrt(3)*sigma over 6*448; stored inverted for compressed-tensors) and
  whose spread matches that sigma; static input scales are 8/(6*448);
- the tp8 preset (4 layers, one case, ~1.3 GB, marked slow): 0-2 dense, 3 moe, 128 experts;
- --verify passes on a good directory and fails naming the tensor after one e4m3 scale byte
  of a copy is set to 0x7f (NaN);
- a layer limit never opens the shards holding only later layers (they are deleted);
- --device-arch x --moe-backend decisions, the dropped-metadata line, unknown backend names;
- gen atomicity: never writes into an existing directory; a killed gen leaves no target.
Limits: the tiny preset's sizes are read from gen.c (hidden 256, 8 experts, I 128, top-2).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import safetensors.numpy as stn
from safetensors import safe_open

from conftest import (E4, copy_model, model_shards, mxfp8_dequant, nvfp4_dequant, read_st, run,
                      st_header, tool_path, tree_hashes)

FORMATS = ["modelopt", "compressed-tensors", "minimax-m31"]
ACTS = ["none", "static", "per-token"]
ACT_KEY = {"none": ("none", "none"), "static": ("nvfp4-static", "nvfp4-static"),
           "per-token": ("nvfp4-per-token", "none")}
TINY = dict(hidden=256, experts=8, inter=128, layers=4, topk=2, vocab=1024)
Z_BOUND = 2 * np.sqrt(3)
SHARD = 400000


def layer_of(name):
    m = re.search(r"(?:^|\.)model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def all_tensors(d):
    """{name: (shard file, array)} over every shard python reads."""
    shards, _ = model_shards(d)
    out = {}
    for s in shards:
        for name, arr in read_st(os.path.join(d, s)).items():
            assert name not in out, f"tensor {name} in two shards"
            out[name] = (s, arr)
    return out


def global_of(t, base, ct):
    """The decode global scale(s) of an NVFP4 linear as gen.c documents the storage."""
    if ct:
        return 1.0 / t[base + ".weight_global_scale"][1].astype(np.float64)
    return t[base + ".weight_scale_2"][1].astype(np.float64)


@pytest.mark.parametrize("shard_size", [SHARD, None], ids=["sharded", "single"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gen_inspect_round_trip(gen_tiny, fmt, act, shard_size):
    d = gen_tiny(fmt, act, shard_size)
    shards, wm = model_shards(d)
    if shard_size:
        assert len(shards) >= 3, f"--shard-size {shard_size} gave {shards}"
        assert not os.path.exists(os.path.join(d, "model.safetensors"))
    else:
        assert wm is None and os.path.exists(os.path.join(d, "model.safetensors"))
    assert sorted(os.listdir(d)) == sorted(
        shards + ["config.json"] + (["model.safetensors.index.json"] if wm else [])
        + (["hf_quant_config.json"] if fmt == "modelopt" else [])), os.listdir(d)

    # python reads every shard, with safe_open as well as deserialize
    t = all_tensors(d)
    for s in shards:
        with safe_open(os.path.join(d, s), "np") as f:
            assert set(f.keys()) == {n for n, (sh, _) in t.items() if sh == s}
    if wm is not None:
        assert wm == {n: sh for n, (sh, _) in t.items()}

    j = run("inspect", d, "--json", "--device-arch", "cpu", check=0).json()
    assert j["num_layers"] == 4 and j["hidden"] == 256 and j["experts"] == 8
    assert j["moe_intermediate"] == 128 and j["topk"] == 2
    assert j["tensors"] == len(t)
    assert j["bytes"] == sum(a.nbytes for _, a in t.values())
    assert sum(j["bytes_by_scheme"].values()) == j["bytes"]
    assert j["shards_total"] == len(shards)
    assert sorted(j["shards_touched"]) == shards
    assert j["quantization"] == fmt
    fc1, fc2 = ACT_KEY[act]
    base_w = "bf16" if fmt == "compressed-tensors" else "mxfp8"
    L = j["layers"]
    assert [l["index"] for l in L] == [0, 1, 2, 3]
    assert L[0]["kind"] == "dense" and L[0]["experts"] == 0 and L[0]["weight_scheme"] == base_w
    assert L[0]["activation_scheme"] == "none" and L[0]["error"] is None
    for l in L[1:]:
        assert l["kind"] == "moe" and l["experts"] == 8 and l["weight_scheme"] == "nvfp4", l
        assert (l["activation_scheme"], l["activation_scheme_fc2"]) == (fc1, fc2), l
        assert l["backend"] == "reference" and l["error"] is None, l
        if act == "none":
            assert l["dropped"] is None
        else:
            assert fc1 in l["dropped"], l
    assert j["bytes_by_scheme"]["nvfp4"] == sum(
        a.nbytes for n, (_, a) in t.items() if ".experts." in n)


def linears(t, fmt, layer):
    """[(base, packed name suffix)] of the routed-expert NVFP4 linears of a layer."""
    pre = "language_model." if fmt == "minimax-m31" else ""
    ws = ["w1", "w2"] if fmt == "minimax-m31" else ["w1", "w3", "w2"]
    return [f"{pre}model.layers.{layer}.block_sparse_moe.experts.{e}.{w}"
            for e in range(8) for w in ws]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gen_names_and_nvfp4_values(gen_tiny, fmt, act):
    d = gen_tiny(fmt, act, SHARD)
    t = all_tensors(d)
    ct = fmt != "modelopt"
    H, I = 256, 128
    pre = "language_model." if fmt == "minimax-m31" else ""
    assert f"{pre}model.embed_tokens.weight" in t and f"{pre}lm_head.weight" in t
    shards, _ = model_shards(d)
    assert t[f"{pre}model.embed_tokens.weight"][0] == shards[0], "embed must be in the first shard"
    assert t[f"{pre}lm_head.weight"][0] == shards[-1], "lm_head must be in the last shard"
    last_layer_shard = max(shards.index(sh) for n, (sh, _) in t.items() if layer_of(n) >= 0)
    assert shards.index(t[f"{pre}model.norm.weight"][0]) >= last_layer_shard, "norm must follow the layers"
    for L in (1, 2, 3):
        for base in linears(t, fmt, L):
            stacked = base.endswith("w1") and fmt == "minimax-m31"
            down = base.endswith("w2")
            n, k = (H, I) if down else ((2 * I if stacked else I), H)
            pk = base + (".weight_packed" if ct else ".weight")
            assert t[pk][1].dtype == np.uint8 and t[pk][1].shape == (n, k // 2), pk
            sc = t[base + ".weight_scale"][1]
            assert sc.dtype == E4 and sc.shape == (n, k // 16), base
            g = np.atleast_1d(global_of(t, base, ct))
            assert g.shape == ((2,) if stacked else (1,)), base
            assert np.all(np.isfinite(g)) and np.all(g > 0)
            # gen.c: sigma = 0.02 * (0.6 + 0.8 u), global = 2*sqrt(3)*sigma / (6*448)
            sig = g * 6 * 448 / Z_BOUND
            assert np.all((sig >= 0.02 * 0.6 * 0.999) & (sig <= 0.02 * 1.4 * 1.001)), (base, sig)
            w = nvfp4_dequant(t[pk][1], sc, 1.0)
            parts = np.split(w, len(g), axis=0)
            for p, gp, sp in zip(parts, g, sig):
                wp = p * gp
                assert np.all(np.isfinite(wp)), base
                bound = Z_BOUND * sp
                # e4m3 rounds the block scale up by at most 1/16, e2m1 saturates at 6
                assert np.max(np.abs(wp)) <= bound * (1 + 1 / 16) * 1.0001, (base, np.max(np.abs(wp)), bound)
                assert np.max(np.abs(wp)) >= 0.6 * bound, (base, np.max(np.abs(wp)), bound)
                assert abs(np.std(wp) / sp - 1) < 0.1, (base, np.std(wp), sp)
            fc2_static = act == "static"
            fc1_static = act == "static"
            has_in = fc2_static if down else fc1_static
            in_name = base + (".input_global_scale" if ct else ".input_scale")
            assert (in_name in t) == has_in, in_name
            if has_in:
                v = float(t[in_name][1])
                v = 1.0 / v if ct else v
                assert v == pytest.approx(8 / (6 * 448), rel=1e-6)
        if fmt == "minimax-m31":
            assert not any(f".layers.{L}.block_sparse_moe.experts.0.w3" in n for n in t)
    # base linears: mxfp8 (ue8m0 scales) or bf16; all finite
    for n, (_, a) in t.items():
        if a.dtype == E4 and not n.endswith("weight_scale"):
            sname = n + "_scale_inv" if fmt == "minimax-m31" else n + "_scale"
            assert sname in t, sname
            w = mxfp8_dequant(a, t[sname][1])
            assert np.all(np.isfinite(w)) and 0.005 < np.std(w) < 0.05, n
        elif a.dtype.name == "bfloat16" or a.dtype == np.float32:
            assert np.all(np.isfinite(a.astype(np.float64))), n


def test_config_declares_what_gen_wrote(gen_tiny):
    d = gen_tiny("minimax-m31", "per-token", SHARD)
    cfg = json.load(open(os.path.join(d, "config.json")))
    tc = cfg["text_config"]
    assert tc["num_local_experts"] == 8 and tc["num_hidden_layers"] == 4
    assert tc["hidden_act"] == "swigluoai" and tc["routed_scaling_factor"] == 2.0
    q = cfg["quantization_config"]
    assert q["quant_method"] == "mxfp8" and q["moe_quant_algo"] == "NVFP4"
    d = gen_tiny("modelopt", "none", SHARD)
    hq = json.load(open(os.path.join(d, "hf_quant_config.json")))
    assert hq["quantization"]["quant_algo"] == "MIXED_PRECISION"


@pytest.mark.slow
def test_tp8_preset_four_layers(tmp_path):
    d = tmp_path / "tp8"
    try:
        check_tp8(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)  # ~1.3 GB: do not leave it to pytest's tmp retention


def check_tp8(d):
    run("gen", d, "--preset", "minimax-m3.1-flash-tp8", "--layers", 4, "--format", "minimax-m31",
        "--act-scheme", "per-token", "--shard-size", 300_000_000, timeout=600, check=0)
    j = run("inspect", d, "--json", "--device-arch", "cpu", check=0).json()
    assert j["num_layers"] == 4 and j["experts"] == 128 and j["hidden"] == 6144
    assert j["moe_intermediate"] == 384
    kinds = [(l["index"], l["kind"], l["experts"]) for l in j["layers"]]
    assert kinds == [(0, "dense", 0), (1, "dense", 0), (2, "dense", 0), (3, "moe", 128)]
    l3 = j["layers"][3]
    assert l3["weight_scheme"] == "nvfp4" and l3["activation_scheme"] == "nvfp4-per-token"
    assert l3["activation_scheme_fc2"] == "none"
    shards, wm = model_shards(d)
    assert j["shards_total"] == len(shards) and len(shards) >= 4
    # the shard headers (read by hand) account for every tensor and byte inspect reports
    n, nbytes = 0, 0
    for s in shards:
        _, h, _ = st_header(os.path.join(d, s))
        h.pop("__metadata__", None)
        n += len(h)
        nbytes += sum(v["data_offsets"][1] - v["data_offsets"][0] for v in h.values())
    assert (j["tensors"], j["bytes"]) == (n, nbytes)
    assert n == len(wm)


# ---- --verify ------------------------------------------------------------------------------

def test_verify_good_and_corrupted(gen_tiny, tmp_path):
    src = gen_tiny("modelopt", "static", SHARD)
    r = run("inspect", src, "--verify", check=0)
    assert "verify" in r.out and "FAILED" not in r.out
    j = run("inspect", src, "--verify", "--json", check=0).json()
    assert j["verify"] == []
    d = copy_model(src, tmp_path / "bad")
    name = "model.layers.2.block_sparse_moe.experts.5.w3.weight_scale"
    _, wm = model_shards(d)
    shard = os.path.join(d, wm[name])
    _, h, start = st_header(shard)
    off = start + h[name]["data_offsets"][0] + 7
    raw = bytearray(open(shard, "rb").read())
    assert raw[off] != 0x7F
    raw[off] = 0x7F
    with open(shard, "wb") as f:  # a copy, rewritten
        f.write(raw)
    before = tree_hashes(d)
    r = run("inspect", d, "--verify")
    assert r.rc == 1, str(r)
    assert name in r.out and wm[name] in r.out and "NaN" in r.out, str(r)
    r = run("inspect", d, "--verify", "--json")
    assert r.rc == 1
    v = r.json()["verify"]
    assert [x["tensor"] for x in v] == [name], v
    assert "1 of" in v[0]["problem"]
    assert tree_hashes(d) == before
    # without --verify the values are not read
    run("inspect", d, check=0)


# ---- layer limit -------------------------------------------------------------------------

def test_layer_limit_never_opens_later_shards(gen_tiny, tmp_path):
    d = copy_model(gen_tiny("modelopt", "per-token", 100000), tmp_path / "m")
    shards, wm = model_shards(d)
    by_shard = {}
    for n, s in wm.items():
        by_shard.setdefault(s, []).append(n)
    # gen's layout: embed first, layers in order, norm / lm_head last
    assert wm["model.embed_tokens.weight"] == shards[0]
    assert wm["lm_head.weight"] == shards[-1]
    assert shards.index(wm["model.norm.weight"]) >= max(shards.index(s) for n, s in wm.items() if layer_of(n) >= 0)
    late = [s for s, names in by_shard.items() if all(layer_of(n) >= 2 for n in names)]
    layer3 = {wm[n] for n in wm if layer_of(n) == 3}
    # every shard with layer-3 tensors goes, except one that also holds norm / lm_head
    assert len(late) >= 4 and layer3 - {wm["model.norm.weight"], shards[-1]} <= set(late), (late, layer3)
    for s in late:
        os.remove(os.path.join(d, s))
    j = run("inspect", d, "--layers", 2, "--json", "--device-arch", "cpu", check=0).json()
    assert j["num_layers"] == 2 and [l["kind"] for l in j["layers"]] == ["dense", "moe"]
    assert not set(j["shards_touched"]) & set(late), j["shards_touched"]
    kept = [n for n in wm if layer_of(n) < 2]
    assert j["tensors"] == len(kept)
    # `layer --layer 1` opens layers < 2 only, too
    x = tmp_path / "x.safetensors"
    stn.save_file({"x": np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)}, str(x))
    run("layer", d, "--layer", 1, "--input", x, "--output", tmp_path / "y.safetensors", check=0)
    # the deleted shards mattered: without the limit inspect must fail and name one
    r = run("inspect", d)
    assert r.rc == 1 and any(s in r.err for s in late), str(r)


# ---- backends ------------------------------------------------------------------------------

def moe_layers(j):
    return [l for l in j["layers"] if l["kind"] == "moe"]


CANON = {"auto": None, "reference": "reference", "emulation": "emulation", "w4a16-mma": "w4a16-mma",
         "marlin": "w4a16-mma", "w4a16-sm90": "w4a16-sm90", "humming": "w4a16-sm90"}


def expected_backend(arch, backend):
    """(backend chosen, None) or (None, the reason the explicit backend is refused)."""
    if backend == "auto":
        return {"sm90": "w4a16-sm90", "sm80": "w4a16-mma", "cpu": "reference"}[arch], None
    want = CANON[backend]
    if want in ("w4a16-mma", "w4a16-sm90") and arch == "cpu":
        return None, "it needs a CUDA device"
    if want == "w4a16-sm90" and arch != "sm90":
        return None, f"it runs on sm90-sm90 and the device is {arch}"
    return want, None


@pytest.mark.parametrize("arch", ["sm90", "sm80", "cpu"])
@pytest.mark.parametrize("backend", list(CANON))
def test_backend_decisions(gen_tiny, arch, backend):
    d = gen_tiny("modelopt", "per-token", SHARD)
    r = run("inspect", d, "--json", "--device-arch", arch, "--moe-backend", backend)
    j = r.json()
    assert j["device"] == arch and j["moe_backend"] == backend
    want, refused = expected_backend(arch, backend)
    if refused:
        name = CANON[backend]
        assert r.rc == 1, str(r)
        for l in moe_layers(j):
            assert l["backend"] is None and l["precision"] is None
            assert l["error"].startswith(f"backend '{name}' cannot run layer {l['index']} ("), l
            assert refused in l["error"], l
        assert j["layers"][0]["error"] is None
        t = run("inspect", d, "--device-arch", arch, "--moe-backend", backend)
        assert t.rc == 1 and f"error: backend '{name}' cannot run layer 1 (" in t.out, str(t)
        return
    assert r.rc == 0, str(r)
    for l in moe_layers(j):
        assert l["backend"] == want and l["error"] is None, l
        if want == "emulation":
            assert l["precision"] == "W4A4-emulated" and l["dropped"] is None, l
        else:
            assert l["precision"] == ("reference" if want == "reference" else "W4A16"), l
            assert "nvfp4-per-token" in l["dropped"], l
        if want == "w4a16-sm90":
            assert l["kernels"].startswith("decode up to") and l["kernels"].endswith("sm90-wgmma"), l


@pytest.mark.parametrize("act", ACTS)
def test_sm90_auto_drops_once_per_group(gen_tiny, act):
    d = gen_tiny("minimax-m31", act, SHARD)
    r = run("inspect", d, "--device-arch", "sm90", check=0)
    assert re.search(r"backend w4a16-sm90, precision W4A16", r.out), r.out
    dropped = [l for l in r.err.splitlines() if "dropped" in l]
    if act == "none":
        assert dropped == [], r.err
        return
    scheme = ACT_KEY[act][0]
    assert len(dropped) == 1, r.err  # layers 1-3 are one group
    assert "layers 1-3" in dropped[0] and "w4a16-sm90" in dropped[0] and scheme in dropped[0], dropped
    j = run("inspect", d, "--json", "--device-arch", "sm90", check=0).json()
    for l in moe_layers(j):
        assert (l["backend"], l["precision"]) == ("w4a16-sm90", "W4A16") and scheme in l["dropped"]


def test_emulation_without_a4_declaration(gen_tiny):
    j = run("inspect", gen_tiny("modelopt", "none", SHARD), "--json", "--device-arch", "cpu",
            "--moe-backend", "emulation", check=0).json()
    for l in moe_layers(j):
        assert l["precision"] == "W4A16-emulated" and l["dropped"] is None


def test_unknown_backend_and_arch(gen_tiny):
    d = gen_tiny("modelopt", "per-token", SHARD)
    r = run("inspect", d, "--moe-backend", "nonsense")
    assert r.rc == 2 and "nonsense" in r.err, str(r)
    for name in ("auto", "reference", "emulation", "w4a16-mma", "marlin", "w4a16-sm90", "humming"):
        assert name in r.err, str(r)
    r = run("inspect", d, "--device-arch", "sm70")
    assert r.rc == 2 and "sm70" in r.err and "sm90" in r.err, str(r)


# ---- gen atomicity -----------------------------------------------------------------------

def test_gen_refuses_existing_dir(tmp_path):
    d = tmp_path / "exists"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    before = tree_hashes(d)
    r = run("gen", d, "--preset", "tiny")
    assert r.rc == 1 and "already exists" in r.err and str(d) in r.err, str(r)
    assert tree_hashes(d) == before
    assert sorted(os.listdir(tmp_path)) == ["exists"]
    e = tmp_path / "empty"
    e.mkdir()
    assert run("gen", e, "--preset", "tiny").rc == 1
    assert os.listdir(e) == []


def test_gen_killed_leaves_no_target(tmp_path):
    d = tmp_path / "killed"
    p = subprocess.Popen([tool_path(), "gen", str(d), "--preset", "minimax-m3.1-flash-tp8", "--layers", "4",
                          "--format", "minimax-m31", "--act-scheme", "per-token"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        assert p.poll() is None, "gen of the tp8 preset finished within 1 s: the kill proves nothing"
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not os.path.exists(d)
    partial = [n for n in os.listdir(tmp_path) if n.startswith("killed.partial-")]
    assert partial == [f"killed.partial-{p.pid}"] or partial == [], os.listdir(tmp_path)
    for n in partial:
        assert not os.path.exists(tmp_path / n / "config.json")
        shutil.rmtree(tmp_path / n)
