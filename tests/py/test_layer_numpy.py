"""`fp4moe layer` against an independent float64 numpy reference (DESIGN.md sections 2-6).

The checkpoints are written here with the python `safetensors` package; the quantizers are
numpy + ml_dtypes (NVFP4: e4m3 block scale per 16 + fp32 global decode scale, e2m1 packed low
nibble first; MXFP8: e4m3 + ue8m0 per 32; bf16). The reference dequantizes those weights and
computes section 4 in float64: router logits, sigmoid + e_score_correction_bias selection
with renormalized weights times routed_scaling_factor (MiniMax-M3 form), or softmax without
renormalization (qwen3_moe, mlp.experts naming); SwiGLU-OAI (limit 7, alpha 1.702) or SiLU
experts, the ungated shared expert, and the dense MLP of layer 0. Metadata shapes: ModelOpt
hf_quant_config MIXED_PRECISION, compressed-tensors config_groups (weight_packed,
weight_global_scale / input_global_scale stored inverted), and MiniMax-M3.1 (text_config,
mxfp8 base, stacked w1 = [gate; up] with two global scales).

Backends: reference must match with ||y-ref||/||ref|| < 1e-5, equal top-k sets and weights
within 1e-5. emulation is compared with a numpy transcription of the A4 scheme (per token:
t_m = amax|x_m| / (448*6); static: t = input_scale; the row is NVFP4-quantized with global
t in float32 arithmetic, ties to even) at < 1e-4, and must differ from reference by > 1e-3.
Edge cases: M = 1, top-k = E, an expert no token reaches, every token on one expert.
Limits: one MoE layer (layer 1) after one dense layer; sizes are small (H <= 256, E = 8).
"""
import json
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np
import pytest
import safetensors.numpy as stn
from safetensors import safe_open

from conftest import (BF16, E4, mxfp8_dequant, mxfp8_quant, nvfp4_dequant, nvfp4_quant, run,
                      e2m1_decode, unpack_e2m1)

ALPHA = float(np.float32(1.702))  # the tool reads swiglu_alpha as fp32
LIMIT = 7.0
A4_DIV = np.float32(448 * 6)


@dataclass(frozen=True)
class Spec:
    H: int = 128
    E: int = 8
    I: int = 64
    topk: int = 2
    shared: int = 64            # shared expert width; 0: none
    dense: int = 128            # dense MLP width of layer 0
    act: str = "swigluoai"      # or "silu"
    family: str = "minimax"     # "minimax": sigmoid+bias, x2, renorm; "qwen": softmax, no renorm
    meta: str = "modelopt"      # "modelopt" | "ct" | "m31"
    a4: str = "none"            # "none" | "static" | "per-token" (FC1 only)
    base: str = "bf16"          # dense / shared linears: "bf16" | "mxfp8"
    gain: float = 1.0           # gate/up weight scale: 4 drives SwiGLU-OAI into its clamp
    bias: tuple = ()            # ((expert, added bias), ...)
    shards: bool = False
    seed: int = 0


# ---- building a checkpoint -----------------------------------------------------------------

@dataclass
class Linear:
    w: np.ndarray               # float64 [N, K], exactly as the tool dequantizes it
    a4: str = "none"            # activation scheme of this linear's input
    t: float = 0.0              # static input scale (decode), fp32 value the tool reads


@dataclass
class Model:
    spec: Spec
    router: np.ndarray = None
    bias: np.ndarray = None
    experts: list = field(default_factory=list)   # [(gate, up, down) Linear]
    shared: tuple = None
    dense: tuple = None


def names(s):
    pre = "language_model." if s.meta == "m31" else ""
    blk = "block_sparse_moe" if s.family == "minimax" else "mlp"
    proj = ("w1", "w3", "w2") if s.family == "minimax" else ("gate_proj", "up_proj", "down_proj")
    return pre, blk, proj


def config_of(s):
    if s.family == "minimax":
        c = {"architectures": ["MiniMaxM3ForCausalLM"], "model_type": "minimax_m3",
             "hidden_size": s.H, "num_hidden_layers": 2, "first_k_dense_replace": 1,
             "intermediate_size": s.dense, "moe_intermediate_size": s.I,
             "num_local_experts": s.E, "shared_intermediate_size": s.shared,
             "num_experts_per_tok": s.topk, "scoring_func": "sigmoid", "use_routing_bias": True,
             "norm_topk_prob": True, "routed_scaling_factor": 2.0}
    else:
        c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
             "hidden_size": s.H, "num_hidden_layers": 2, "intermediate_size": s.dense,
             "moe_intermediate_size": s.I, "num_experts": s.E, "num_experts_per_tok": s.topk,
             "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [0]}
        if s.shared:
            assert s.shared == s.I
            c["n_shared_experts"] = 1
    c["hidden_act"] = s.act
    if s.act == "swigluoai":
        c.update(swiglu_limit=LIMIT, swiglu_alpha=1.702)
    return c


def ct_act(a4):
    if a4 == "none":
        return None
    if a4 == "static":
        return {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                "dynamic": False, "symmetric": True}
    return {"num_bits": 4, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}


def build(d, s):
    """Write checkpoint s into directory d; return the Model the reference runs."""
    os.makedirs(d)
    rng = np.random.default_rng(1000 + s.seed)
    pre, blk, proj = names(s)
    ct = s.meta in ("ct", "m31")
    base = "mxfp8" if s.meta == "m31" else s.base
    t0, t1 = {}, {}              # tensors of layer 0, layer 1
    m = Model(s)
    quant_layers = {}

    def put_base(tensors, module, n, k):
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        if base == "bf16":
            wb = w.astype(BF16)
            tensors[pre + module + ".weight"] = wb
            return Linear(wb.astype(np.float64))
        q, sc = mxfp8_quant(w)
        tensors[pre + module + ".weight"] = q.view(E4)
        tensors[pre + module + (".weight_scale_inv" if s.meta == "m31" else ".weight_scale")] = sc
        quant_layers[module] = {"quant_algo": "MXFP8"}
        return Linear(mxfp8_dequant(q, sc))

    def nv(w):
        g = np.float32(np.max(np.abs(w)) / np.float32(6 * 448))
        p, sc = nvfp4_quant(w, g)
        return p, sc, g

    def stored_global(g):
        """What the file holds, and the fp32 decode value the tool derives from it."""
        if ct:
            inv = np.float32(1) / np.float32(g)
            return inv, np.float32(1) / inv
        return np.float32(g), np.float32(g)

    def a4_of(which):
        if s.a4 == "per-token":
            return "per-token" if which != 2 else "none"
        return s.a4

    # layer 0: dense MLP
    lin = [put_base(t0, f"model.layers.0.mlp.{p}", n, k)
           for p, n, k in (("gate_proj", s.dense, s.H), ("up_proj", s.dense, s.H), ("down_proj", s.H, s.dense))]
    m.dense = tuple(lin)

    # layer 1: router, experts, shared expert
    router = (rng.standard_normal((s.E, s.H)) / np.sqrt(s.H)).astype(np.float32)
    t1[f"{pre}model.layers.1.{blk}.gate.weight"] = router
    m.router = router.astype(np.float64)
    if s.family == "minimax":
        bias = (0.05 * rng.standard_normal(s.E)).astype(np.float32)
        for j, v in s.bias:
            bias[j] += np.float32(v)
        t1[f"{pre}model.layers.1.{blk}.e_score_correction_bias"] = bias
        m.bias = bias.astype(np.float64)
    calib = rng.standard_normal((64, s.H)).astype(np.float32)
    for j in range(s.E):
        mod = [f"model.layers.1.{blk}.experts.{j}.{p}" for p in proj]
        sig = np.array([s.gain, s.gain, 1.0]) * rng.uniform(0.6, 1.4, 3)
        ws = [(rng.standard_normal((s.I, s.H)) * sig[0] / np.sqrt(s.H)).astype(np.float32),
              (rng.standard_normal((s.I, s.H)) * sig[1] / np.sqrt(s.H)).astype(np.float32),
              (rng.standard_normal((s.H, s.I)) * sig[2] / np.sqrt(s.I)).astype(np.float32)]
        q = [nv(w) for w in ws]
        deq = []
        for w_i, (p, sc, g) in enumerate(q):
            _, dec = stored_global(g)
            deq.append(nvfp4_dequant(p, sc, dec))
        # static input scales: FC1 from the calibration inputs (up's a little larger, so
        # the tool must quantize up's input on its own), FC2 from the calibration activations
        s1 = np.float32(np.max(np.abs(calib)) / A4_DIV)
        a_cal = act(s.act, calib.astype(np.float64) @ deq[0].T, calib.astype(np.float64) @ deq[1].T)
        s2 = np.float32(np.max(np.abs(a_cal)) / A4_DIV)
        ins = [s1, s1 * np.float32(1.25), s2] if s.meta != "m31" else [s1, s1, s2]
        in_dec = []
        for v in ins:
            if ct:
                inv = np.float32(1) / v
                in_dec.append(np.float32(1) / inv)
            else:
                in_dec.append(v)
        lins = [Linear(deq[w_i], a4_of(w_i), float(in_dec[w_i])) for w_i in range(3)]
        m.experts.append(tuple(lins))
        if s.meta == "m31":   # stacked w1 = [gate; up], two global scales, w2
            base1 = f"{pre}{mod[0]}"
            t1[base1 + ".weight_packed"] = np.concatenate([q[0][0], q[1][0]])
            t1[base1 + ".weight_scale"] = np.concatenate([q[0][1], q[1][1]]).view(E4)
            t1[base1 + ".weight_global_scale"] = np.array([stored_global(q[0][2])[0], stored_global(q[1][2])[0]], np.float32)
            if s.a4 == "static":
                t1[base1 + ".input_global_scale"] = np.array(np.float32(1) / ins[0], np.float32)
            b2 = f"{pre}{mod[2]}"
            t1[b2 + ".weight_packed"], t1[b2 + ".weight_scale"] = q[2][0], q[2][1].view(E4)
            t1[b2 + ".weight_global_scale"] = np.array(stored_global(q[2][2])[0], np.float32)
            if s.a4 == "static":
                t1[b2 + ".input_global_scale"] = np.array(np.float32(1) / ins[2], np.float32)
            continue
        for w_i in range(3):
            b = pre + mod[w_i]
            p, sc, g = q[w_i]
            t1[b + (".weight_packed" if ct else ".weight")] = p
            t1[b + ".weight_scale"] = sc.view(E4)
            t1[b + (".weight_global_scale" if ct else ".weight_scale_2")] = np.array(stored_global(g)[0], np.float32)
            if a4_of(w_i) == "static":
                v = np.float32(1) / ins[w_i] if ct else ins[w_i]
                t1[b + (".input_global_scale" if ct else ".input_scale")] = np.array(v, np.float32)
            entry = {"quant_algo": "W4A16_NVFP4" if a4_of(w_i) == "none" else "NVFP4", "group_size": 16}
            if a4_of(w_i) == "per-token":
                entry["activation_scheme"] = "dynamic_per_token"
            quant_layers[mod[w_i]] = entry
    if s.shared:
        m.shared = tuple(put_base(t1, f"model.layers.1.{blk}.shared_experts.{p}", n, k)
                         for p, n, k in (("gate_proj", s.shared, s.H), ("up_proj", s.shared, s.H),
                                         ("down_proj", s.H, s.shared)))

    # files
    cfg = config_of(s)
    if s.meta == "m31":
        q = {"quant_method": "mxfp8", "weight_block_size": [1, 32], "moe_quant_algo": "NVFP4",
             "moe_quant_format": "nvfp4-pack-quantized", "modules_to_not_convert": ["lm_head"]}
        if s.a4 == "per-token":
            q["moe_fc1_activation_scheme"] = "per-token"
        elif s.a4 == "static":
            q["moe_activation_scheme"] = "static"
        cfg = {"architectures": ["MiniMaxM3ForConditionalGeneration"], "model_type": "minimax_m3_vl",
               "text_config": cfg, "quantization_config": q}
    elif s.meta == "ct":
        fc1 = r"re:.*experts\.\d+\.(w1|w3|gate_proj|up_proj)$"
        fc2 = r"re:.*experts\.\d+\.(w2|down_proj)$"
        wq = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
              "symmetric": True, "dynamic": False}
        groups = {"group_0": {"targets": [fc1], "weights": wq, "input_activations": ct_act(a4_of(0)),
                              "format": "nvfp4-pack-quantized"},
                  "group_1": {"targets": [fc2], "weights": wq, "input_activations": ct_act(a4_of(2)),
                              "format": "nvfp4-pack-quantized"}}
        if base == "mxfp8":
            groups["group_2"] = {"targets": [r"re:.*(mlp|shared_experts)\.(gate|up|down)_proj$"],
                                 "weights": {"num_bits": 8, "type": "float", "strategy": "group",
                                             "group_size": 32},
                                 "input_activations": None}
        cfg["quantization_config"] = {"quant_method": "compressed-tensors",
                                      "format": "nvfp4-pack-quantized",
                                      "quantization_status": "compressed", "config_groups": groups,
                                      "ignore": ["lm_head", r"re:.*\.gate$"]}
    else:
        hq = {"producer": {"name": "modelopt", "version": "0.0-test"},
              "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                               "exclude_modules": ["lm_head", "*.gate"],
                               "quantized_layers": quant_layers}}
        json.dump(hq, open(os.path.join(d, "hf_quant_config.json"), "w"), indent=1)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    meta = {"format": "pt"}
    if s.shards:
        files = {"model-00001-of-00002.safetensors": t0, "model-00002-of-00002.safetensors": t1}
        for f, t in files.items():
            stn.save_file(t, os.path.join(d, f), metadata=meta)
        wm = {n: f for f, t in files.items() for n in t}
        json.dump({"metadata": {"total_size": sum(a.nbytes for t in files.values() for a in t.values())},
                   "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    else:
        stn.save_file({**t0, **t1}, os.path.join(d, "model.safetensors"), metadata=meta)
    return m


# ---- the float64 reference -------------------------------------------------------------------

def act(kind, g, u):
    if kind == "silu":
        return g / (1 + np.exp(-g)) * u
    g = np.minimum(g, LIMIT)
    u = np.clip(u, -LIMIT, LIMIT)
    return (u + 1) * g / (1 + np.exp(-ALPHA * g))


def a4_rows(x, lin):
    """The rows a linear sees under the A4 emulation: NVFP4-quantized with global t (per token
    amax/(448*6), or the static input scale), dequantized; float32 arithmetic like the format."""
    x32 = np.asarray(x, np.float32)
    out = np.zeros(x32.shape, np.float64)
    for r in range(x32.shape[0]):
        amax = np.max(np.abs(x32[r]))
        t = np.float32(lin.t) if lin.a4 == "static" else np.float32(amax / A4_DIV)
        if amax == 0 or not t > 0:
            continue
        p, sc = nvfp4_quant(x32[r], t)
        out[r] = nvfp4_dequant(p, sc, 1.0) * np.float64(t)
    return out


def linear(x, lin, emulate):
    if emulate and lin.a4 != "none":
        x = a4_rows(x, lin)
    return x @ lin.w.T


def ffn(kind, x, lins, emulate):
    g = linear(x, lins[0], emulate)
    u = linear(x, lins[1], emulate)
    a = act(kind, g, u)
    if emulate and lins[2].a4 != "none":
        a = a.astype(np.float32)  # the tool holds activations in fp32
    return linear(a, lins[2], emulate)


def route(m, x):
    s = m.spec
    logits = x @ m.router.T
    if s.family == "minimax":
        p = 1 / (1 + np.exp(-logits))
        sel = p + m.bias
    else:
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        sel = p
    ids = np.stack([np.lexsort((np.arange(s.E), -sel[t]))[: s.topk] for t in range(len(x))])
    w = np.take_along_axis(p, ids, axis=1)
    if s.family == "minimax":
        w = w / w.sum(axis=1, keepdims=True) * 2.0
    return ids, w, sel


def ref_moe(m, x, emulate=False):
    ids, w, _ = route(m, x)
    y = np.zeros_like(x)
    for j in range(m.spec.E):
        tok, slot = np.nonzero(ids == j)
        if len(tok):
            y[tok] += w[tok, slot][:, None] * ffn(m.spec.act, x[tok], m.experts[j], emulate)
    if m.shared:
        y += ffn(m.spec.act, x, m.shared, emulate)
    return y, ids, w


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---- running the tool ------------------------------------------------------------------------

CASES = {
    # MiniMax-M3 form, ModelOpt metadata, bf16 base, clamp active, expert 7 never chosen
    "mm-modelopt": Spec(gain=4.0, bias=((7, -100.0),)),
    # compressed-tensors, mxfp8 base, SiLU, wider, top-4
    "mm-ct-silu": Spec(H=256, I=128, shared=128, topk=4, act="silu", meta="ct", base="mxfp8", seed=1),
    # MiniMax-M3.1: text_config, stacked w1, mxfp8 base, two shards
    "m31-stacked": Spec(H=256, I=96, shared=96, meta="m31", shards=True, seed=2),
    # softmax without renormalization, mlp.experts naming, no shared expert
    "qwen-softmax": Spec(family="qwen", act="silu", shared=0, seed=3),
    # softmax family with compressed-tensors and a (DeepSeek-spelled) shared expert, top-k = E
    "qwen-ct-topk-all": Spec(family="qwen", meta="ct", shared=64, topk=8, seed=4),
    # top-k = E under sigmoid routing
    "mm-topk-all": Spec(topk=8, meta="ct", seed=5),
    # every token on expert 3
    "mm-one-expert": Spec(topk=1, bias=((3, 100.0),), seed=6),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    cache = {}

    def get(spec):
        if spec not in cache:
            d = root / f"m{len(cache)}"
            cache[spec] = (str(d), build(str(d), spec))
        return cache[spec]
    return get


def run_layer(d, layer, x, tmp, backend="reference", bf16=False):
    xin = x.astype(BF16) if bf16 else x.astype(np.float32)
    inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    if os.path.exists(out):
        os.remove(out)
    stn.save_file({"x": xin}, inp)
    run("layer", d, "--layer", layer, "--input", inp, "--output", out, "--moe-backend", backend,
        "--device-arch", "cpu", check=0)
    with safe_open(out, "np") as f:
        res = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    assert meta.get("backend") == backend or layer == 0, meta
    return xin.astype(np.float64), res


def check_moe(m, x64, res):
    y, ids, w = res["y"], res["topk_ids"], res["topk_weights"]
    M, k = x64.shape[0], m.spec.topk
    assert y.shape == (M, m.spec.H) and y.dtype == np.float32
    assert ids.shape == (M, k) and ids.dtype == np.int32 and w.shape == (M, k)
    ry, rids, rw = ref_moe(m, x64)
    for t in range(M):
        assert set(ids[t]) == set(rids[t]), f"token {t}: tool {ids[t]}, reference {rids[t]}"
        got = dict(zip(ids[t].tolist(), w[t].tolist()))
        for e, v in zip(rids[t].tolist(), rw[t].tolist()):
            assert abs(got[e] - v) <= 1e-5, f"token {t} expert {e}: weight {got[e]} vs {v}"
    assert np.all(np.isfinite(y))
    err = rel(y, ry)
    assert err < 1e-5, f"rel err {err:.3e}"
    return ry, rids


@pytest.mark.parametrize("M,bf16", [(1, False), (13, True), (40, False)])
@pytest.mark.parametrize("case", list(CASES))
def test_reference_matches_numpy(built, tmp_path, case, M, bf16):
    spec = CASES[case]
    d, m = built(spec)
    x = np.random.default_rng(zlib.crc32(f"{case} {M}".encode())).standard_normal((M, spec.H))
    x64, res = run_layer(d, 1, x, tmp_path, bf16=bf16)
    _, rids = check_moe(m, x64, res)
    counts = np.bincount(rids.ravel(), minlength=spec.E)
    if case == "mm-modelopt":
        assert counts[7] == 0  # an expert no token reaches
        if spec.gain > 1 and M > 1:  # the SwiGLU clamp is exercised
            g = x64 @ m.experts[0][0].w.T
            assert np.max(g) > LIMIT
    if case == "mm-one-expert":
        assert counts[3] == M and counts.sum() == M
    if spec.topk == spec.E:
        assert np.all(counts == M)


@pytest.mark.parametrize("case", ["mm-modelopt", "mm-ct-silu", "m31-stacked", "qwen-softmax"])
def test_dense_layer_matches_numpy(built, tmp_path, case):
    spec = CASES[case]
    d, m = built(spec)
    x = np.random.default_rng(11).standard_normal((9, spec.H))
    x64, res = run_layer(d, 0, x, tmp_path)
    assert set(res) == {"y"}
    ref = ffn(spec.act, x64, m.dense, False)
    err = rel(res["y"], ref)
    assert err < 1e-5, f"dense rel err {err:.3e}"


def test_input_without_x_fails(built, tmp_path):
    d, _ = built(CASES["mm-modelopt"])
    inp = tmp_path / "in.safetensors"
    stn.save_file({"y": np.zeros((2, 128), np.float32)}, str(inp))
    r = run("layer", d, "--layer", 1, "--input", inp, "--output", tmp_path / "o.safetensors")
    assert r.rc == 1 and "'x'" in r.err and str(inp) in r.err, str(r)
    stn.save_file({"x": np.zeros((2, 100), np.float32)}, str(inp))
    r = run("layer", d, "--layer", 1, "--input", inp, "--output", tmp_path / "o.safetensors")
    assert r.rc == 1 and "[M, 128]" in r.err and "100" in r.err, str(r)


# ---- emulation -------------------------------------------------------------------------------

EMU = {
    "modelopt-per-token": Spec(a4="per-token", gain=2.0, seed=20),
    "modelopt-static": Spec(a4="static", gain=2.0, seed=20),          # same weights as above
    "ct-static": Spec(a4="static", meta="ct", base="mxfp8", act="silu", topk=4, seed=21),
    "ct-per-token": Spec(a4="per-token", meta="ct", family="qwen", act="silu", shared=0, seed=22),
    "m31-per-token": Spec(a4="per-token", meta="m31", H=256, I=128, shared=128, seed=23),
}


def test_emulation_specs_declare_what_they_should(built):
    d, _ = built(EMU["modelopt-per-token"])
    j = run("inspect", d, "--json", "--device-arch", "cpu", "--moe-backend", "emulation", check=0).json()
    l1 = j["layers"][1]
    assert (l1["activation_scheme"], l1["activation_scheme_fc2"]) == ("nvfp4-per-token", "none")
    assert l1["precision"] == "W4A4-emulated"
    for name, fc2 in (("ct-static", "nvfp4-static"), ("m31-per-token", "none")):
        d, _ = built(EMU[name])
        l1 = run("inspect", d, "--json", "--device-arch", "cpu", check=0).json()["layers"][1]
        assert l1["activation_scheme_fc2"] == fc2 and l1["activation_scheme"].startswith("nvfp4-"), (name, l1)


@pytest.mark.parametrize("M", [1, 24])
@pytest.mark.parametrize("case", list(EMU))
def test_emulation_matches_numpy(built, tmp_path, case, M):
    spec = EMU[case]
    d, m = built(spec)
    x = np.random.default_rng(zlib.crc32(f"{case} {M} emu".encode())).standard_normal((M, spec.H)) * 1.5
    x64, emu = run_layer(d, 1, x, tmp_path, backend="emulation")
    want, rids, _ = ref_moe(m, x64, emulate=True)
    assert np.all(np.sort(emu["topk_ids"], axis=1) == np.sort(rids, axis=1)), "router must not be quantized"
    err = rel(emu["y"], want)
    assert err < 1e-4, f"{case} M={M}: emulation vs numpy A4 rel err {err:.3e}"
    _, ref = run_layer(d, 1, x, tmp_path, backend="reference")
    check_moe(m, x64, ref)
    gap = rel(emu["y"], ref["y"])
    assert gap > 1e-3, f"{case}: emulation is within {gap:.1e} of reference: no activation quantization happened"


def test_per_token_and_static_differ(built, tmp_path):
    x = np.random.default_rng(5).standard_normal((16, 128))
    ys = {}
    for name in ("modelopt-per-token", "modelopt-static"):
        d, m = built(EMU[name])
        _, res = run_layer(d, 1, x, tmp_path, backend="emulation")
        ys[name] = res["y"]
    d0, _ = built(EMU["modelopt-per-token"])
    d1, _ = built(EMU["modelopt-static"])
    _, r0 = run_layer(d0, 1, x, tmp_path)
    _, r1 = run_layer(d1, 1, x, tmp_path)
    assert rel(r0["y"], r1["y"]) < 1e-6, "the two checkpoints must hold the same weights"
    assert rel(ys["modelopt-per-token"], ys["modelopt-static"]) > 1e-3


def test_emulation_without_a4_equals_reference(built, tmp_path):
    d, m = built(CASES["mm-ct-silu"])
    x = np.random.default_rng(8).standard_normal((7, 256))
    x64, emu = run_layer(d, 1, x, tmp_path, backend="emulation")
    check_moe(m, x64, emu)


def test_numpy_a4_reference_is_nontrivial():
    """The numpy A4 transcription itself: ties go to even on the e2m1 grid, t_m per token."""
    # static t = 2^-10 and block amax 6 * t: the block scale is e4m3(1) = 1, so x / t lands
    # exactly on the e2m1 grid or exactly halfway between two of its points
    t = 2.0 ** -10
    v = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -2.5, -5, 0, 1, 2, 4])
    got = a4_rows((v * t)[None], Linear(np.eye(16), "static", t))[0] / t
    want = np.array([6, 0, 1, 1, 2, 2, 4, 4, -0, -1, -2, -4, 0, 1, 2, 4])
    assert np.array_equal(got, want), got
    # per token: t_m = amax / (448*6) puts the block amax at e2m1 6 x e4m3 448
    row = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    q = a4_rows(row, Linear(np.eye(32), "per-token"))
    qmax, xmax = np.max(np.abs(q), axis=1), np.max(np.abs(row), axis=1)
    assert np.all(np.abs(qmax / xmax - 1) < 1e-6), (qmax, xmax)
    assert 0.01 < rel(q, row.astype(np.float64)) < 0.2
    assert np.array_equal(e2m1_decode(unpack_e2m1(np.array([[0x21]], np.uint8)))[0], [0.5, 1.0])


# ---- check -------------------------------------------------------------------------------

@pytest.mark.parametrize("act_scheme", ["per-token", "static"])
def test_check_all_backends_cpu(gen_tiny, act_scheme):
    d = gen_tiny("modelopt", act_scheme, 400000)
    r = run("check", d, "--all-backends", "--tokens", 16, "--device-arch", "cpu", check=0)
    lines = r.out.splitlines()
    ref = [l for l in lines if re.match(r"layer 1\s+reference\s", l)]
    emu = [l for l in lines if re.match(r"layer 1\s+emulation\s", l)]
    mma = [l for l in lines if re.match(r"layer 1\s+w4a16-mma\s", l)]
    assert len(ref) == 1 and " PASS" in ref[0], r.out
    assert len(emu) == 1 and " PASS" in emu[0] and "W4A4-emulated" in emu[0], r.out
    assert len(mma) == 1 and "SKIP" in mma[0] and "CUDA" in mma[0], r.out
    assert "FAIL" not in r.out and lines[-1] == "check passed", r.out
