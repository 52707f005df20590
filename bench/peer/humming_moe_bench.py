#!/usr/bin/env python3
"""Peer benchmark: Humming NVFP4-weight / BF16-activation (W4A16) MoE on SM90 (H200).

Adapted from shared/peers/humming_moe_bench.py (written against the July 2026 Humming tree)
to the humming-kernels 0.1.20 wheel; README.md beside this file lists every API difference.
The timing scope is unchanged.  Times the whole routed-expert computation of one MoE layer:

    FC1  gate_up  [E, 2*I, H]   (Humming MoE GEMM, BF16 x NVFP4 -> BF16)
    SwiGLU        silu(gate) * up   (small Triton kernel, one launch)
    FC2  down     [E, H, I]     (Humming MoE GEMM)
    top-k weighted sum          (moe_fused_mul_sum: Triton, one launch; 0.1.20 dropped
                                 humming.ops.moe_fused_mul_sum, so the July kernel is vendored)

in two layouts:

  indexed : Humming "indexed" GEMM.  FC1 gathers token rows itself through sorted_ids
            (moe_align_block_size style, block = the tuned block_shape_m); FC2 reads the
            [M*topk, I] intermediate through its own sorted_ids.
  grouped : Humming "grouped_contiguous" GEMM.  Tokens are permuted into expert order
            (torch index_select) before FC1 and un-permuted (index_copy_) after FC2; both
            copies are inside the timed region.

Weights are random NVFP4 in the ModelOpt checkpoint layout (uint8 e2m1 pairs, e4m3 group-16
scales, fp32 per-expert global scale) converted with Humming's own ModelOpt schema
(ModeloptNvfp4WeightSchema.convert_humming) and repacked by HummingLayer.transform().
Routing metadata (sorted_ids / expert offsets / the permutation) is built before timing and
is not timed.  Kernels are JIT-compiled before timing through HummingKernel.prepare_kernels,
the same entry (and cache key) HummingLayer.forward uses.

Timing: triton.testing.do_bench (median, L2 flushed before every call) of a CUDA-graph
replay of the full MoE ("time us"); also the eager full MoE and FC1 / FC2 alone (graph
replays).  Correctness: ||out-ref||/||ref|| against a float32 torch reference that
dequantizes the NVFP4 weights.

--selftest-api: build one small MoE layer (few experts, few tokens), run every API step once
with a printed line per step, check FC1 / FC2 / full MoE / graph replay against the
reference, and exit (0 = all steps passed).

Run:  PEER_DIR=<folder with humming/ and pylibs/> python3 humming_moe_bench.py  (see README.md)
Writes $OUT/humming.json (or --json PATH).
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # bench/peer/ -> repository root
PEER = os.path.abspath(os.environ.get("PEER_DIR", os.path.join(REPO, ".peer")))
# HUMMING_SRC: a folder holding the `humming` package (an unzipped humming-kernels wheel works).
HUMMING_SRC = os.path.abspath(os.environ.get("HUMMING_SRC", os.path.join(PEER, "humming")))
# PYLIBS: pure-python packages missing on the GPU machine (pyelftools).
PYLIBS = os.path.abspath(os.environ.get("HUMMING_PYLIBS", os.path.join(PEER, "pylibs")))


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def setup_env():
    """Environment Humming needs, set before it is imported (it spawns build subprocesses)."""
    if not os.path.isdir(os.path.join(HUMMING_SRC, "humming")):
        sys.exit(f"humming source not found at {HUMMING_SRC} (carry .peer)")
    for p in (PYLIBS, HUMMING_SRC):
        if p not in sys.path:
            sys.path.insert(0, p)
    pp = [HUMMING_SRC, PYLIBS] + [x for x in os.environ.get("PYTHONPATH", "").split(":") if x]
    os.environ["PYTHONPATH"] = ":".join(pp)
    # JIT caches (humming.utils.jit.get_humming_cache_dir / get_humming_tmp_dir read these).
    os.environ.setdefault("HUMMING_CACHE_DIR", os.path.join(PEER, "humming_cache"))
    os.environ.setdefault("HUMMING_TMP_DIR", "/tmp/humming_tmp")
    os.makedirs(os.environ["HUMMING_TMP_DIR"], exist_ok=True)
    # Parallel JIT builds: humming.utils.cpu.get_parallel_build_workers reads this.
    if args.compile_workers > 0:
        os.environ["HUMMING_MAX_PARALLEL_BUILD_WORKERS"] = str(args.compile_workers)
    # ninja for torch.utils.cpp_extension (the launcher, if no precompiled one fits this torch)
    # lives next to the venv's python.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(":"):
        os.environ["PATH"] = bindir + ":" + os.environ.get("PATH", "")
    # A JIT-built launcher links with -lcuda: make an unversioned libcuda.so findable for ld.
    libdirs = []
    for d in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
              "/usr/local/cuda/lib64/stubs", "/usr/local/cuda/targets/x86_64-linux/lib/stubs"):
        if os.path.exists(os.path.join(d, "libcuda.so")):
            libdirs.append(d)
    if libdirs:
        old = [x for x in os.environ.get("LIBRARY_PATH", "").split(":") if x]
        os.environ["LIBRARY_PATH"] = ":".join(old + [d for d in libdirs if d not in old])
    # Humming keys its kernel cache on .cuh mtimes (jit.compiler.Compiler.cuh_last_update_time);
    # pin them so a carried cache stays valid.
    inc = os.path.join(HUMMING_SRC, "humming", "include")
    for dp, _, fns in os.walk(inc):
        for fn in fns:
            fp = os.path.join(dp, fn)
            try:
                if int(os.stat(fp).st_mtime) != 1767225600:
                    os.utime(fp, (1767225600, 1767225600))
            except OSError:
                pass


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", "-H", type=int, default=3072, help="hidden size H (FC1 K, FC2 N)")
    ap.add_argument("--inter", type=int, nargs="+", default=[384, 3072],
                    help="per-expert intermediate size(s) I (FC1 N = 2*I, FC2 K = I)")
    ap.add_argument("--experts", "-E", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--tokens", "-M", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    ap.add_argument("--layouts", nargs="+", default=["indexed", "grouped"],
                    choices=["indexed", "grouped"])
    ap.add_argument("--warmup-ms", type=float, default=25.0)
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--no-graph", action="store_true", help="time eager calls only")
    ap.add_argument("--no-parts", action="store_true", help="skip FC1/FC2-only timings")
    ap.add_argument("--time-budget", type=float, default=520.0,
                    help="seconds; stop starting new cases after this (results so far are kept)")
    ap.add_argument("--compile-workers", type=int, default=0,
                    help="0 = Humming's default (available CPUs); sets HUMMING_MAX_PARALLEL_BUILD_WORKERS")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--check-repeats", type=int, default=5,
                    help="extra correctness re-runs per case (FC1 alone, FC2 alone on the reference "
                         "activation, full MoE); the table reports the worst rel err seen")
    ap.add_argument("--stream-k", choices=["auto", "off"], default="auto",
                    help="auto = Humming's heuristic (default); off = force use_stream_k=False "
                         "(diagnostic only)")
    ap.add_argument("--save-cache", action="store_true",
                    help="tar Humming's JIT cache into $OUT/humming_cache.tgz (if < 15 MB)")
    ap.add_argument("--json", default=None, help="output JSON path (default $OUT/humming.json)")
    ap.add_argument("--selftest-api", action="store_true",
                    help="only build one small MoE layer (--hidden, first --inter, --selftest-experts "
                         "experts, --selftest-tokens tokens), run each API step once with a printed "
                         "line, check against the reference, exit 0/1")
    ap.add_argument("--selftest-experts", type=int, default=16)
    ap.add_argument("--selftest-tokens", type=int, default=4)
    return ap.parse_args()


# --------------------------------------------------------------------------------------
args = parse_args()
setup_env()

STEP = [0]


def step(msg):
    """Selftest progress line (also used, quietly, to name the failing step)."""
    STEP[0] += 1
    log(f"[api step {STEP[0]:2d}] {msg}")


step("import torch / triton")
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

log(f"python {sys.version.split()[0]}  torch {torch.__version__} (cuda {torch.version.cuda})  "
    f"triton {triton.__version__}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device")
DEV = torch.device("cuda", torch.cuda.current_device())
PROPS = torch.cuda.get_device_properties(DEV)
log(f"device {PROPS.name}  sm_{PROPS.major}{PROPS.minor}  {PROPS.multi_processor_count} SMs")

step("import humming (humming, humming.ops, config.GemmType, kernel.HummingKernel, layer.HummingLayer, "
     "schema.modelopt.ModeloptNvfp4WeightSchema, tune.get_heuristics_config, transform)")
import humming  # noqa: E402
from humming import ops as hops  # noqa: E402
from humming.config import GemmType  # noqa: E402
from humming.kernel.humming import HummingKernel  # noqa: E402
from humming.layer import HummingLayer  # noqa: E402
from humming.ops.utils import init_humming_launcher  # noqa: E402
from humming.schema.modelopt import ModeloptNvfp4WeightSchema  # noqa: E402
from humming.tune import get_heuristics_config  # noqa: E402
import humming.transform as htransform  # noqa: E402

HUMMING_VERSION = getattr(humming, "__version__", "unknown")
log(f"humming {HUMMING_VERSION} imported from {os.path.dirname(humming.__file__)}  "
    f"compiler={os.environ.get('HUMMING_COMPILER', 'auto (NVRTC if cuda.bindings.nvrtc)')}")

# Insurance (July: layer.prepare_humming_weight_scale; 0.1.20: transform.transform_humming_weight_scale,
# called by transform_humming_tensors through the module global): on SM90 it permutes the e4m3
# scale tensor with advanced indexing; if this torch build lacks float8 index kernels, do the
# same permutation on a uint8 view (bit-identical, pure data movement).
_orig_prep_scale = getattr(htransform, "transform_humming_weight_scale", None)
INSURANCE_USED = [0]

if _orig_prep_scale is not None:
    def _prep_scale_safe(weight_scale, *a, **kw):
        try:
            return _orig_prep_scale(weight_scale, *a, **kw)
        except (RuntimeError, NotImplementedError):
            if weight_scale.dtype.itemsize != 1 or weight_scale.dtype == torch.uint8:
                raise
            INSURANCE_USED[0] += 1
            dt = weight_scale.dtype
            return _orig_prep_scale(weight_scale.view(torch.uint8), *a, **kw).view(dt)

    htransform.transform_humming_weight_scale = _prep_scale_safe
else:
    log("note: humming.transform.transform_humming_weight_scale not found; float8 insurance not installed")

SELFTEST = args.selftest_api
E = min(args.experts, args.selftest_experts) if SELFTEST else args.experts
H = args.hidden
TOPK = min(args.topk, E)
FP4_LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       dtype=torch.float32, device=DEV)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


# ----------------------------------------------------------------------------- NVFP4 data
def random_nvfp4(n, k, gen):
    """ModelOpt NVFP4 tensors for E experts of an [n, k] weight (k = reduction dim)."""
    codes = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device=DEV, generator=gen)
    scale = (torch.rand((E, n, k // 16), device=DEV, generator=gen) * 1.5 + 0.5)
    scale = scale.to(torch.float8_e4m3fn)
    # E[e2m1^2] = 8.56 for uniform codes, E[s^2] ~ 1.75: keep outputs O(1) for unit inputs.
    gscale = (torch.rand((E,), device=DEV, generator=gen) * 0.5 + 0.75) / math.sqrt(k * 15.0)
    return codes, scale, gscale.float()


def dequant_expert(codes, scale, gscale, e):
    """float32 [n, k] weight of expert e (e2m1 * e4m3 * fp32 global)."""
    c = codes[e]
    lo = FP4_LUT[(c & 0xF).long()]
    hi = FP4_LUT[(c >> 4).long()]
    w = torch.stack((lo, hi), dim=-1).reshape(c.shape[0], c.shape[1] * 2)
    w = w * scale[e].float().repeat_interleave(16, dim=-1)
    return w * gscale[e]


def weight_bytes_per_expert(n, k):
    return n * k // 2 + n * (k // 16) + 4  # e2m1 + e4m3 group scales + fp32 global scale


def make_layer(n, k, gen, verbose=False):
    """Random ModelOpt NVFP4 weights -> Humming schema/tensors -> HummingLayer (not transformed)."""
    codes, scale, gscale = random_nvfp4(n, k, gen)
    # BaseWeightSchema.convert_humming(tensors, shape_n_stacks, shape_k_stacks, param_dtype,
    #                                  num_experts=None, device=None, convert_symmetric_integer=True,
    #                                  allow_inplace=False) -> (HummingWeightSchema, tensors)
    schema, tensors = ModeloptNvfp4WeightSchema().convert_humming(
        {"weight": codes, "weight_scale": scale, "weight_scale_2": gscale},
        shape_n_stacks=[n], shape_k_stacks=[k], param_dtype=torch.bfloat16, num_experts=E,
        device=DEV)
    if verbose:
        log(f"    convert_humming -> {schema}")
        for key, t in tensors.items():
            log(f"      {key}: {tuple(t.shape)} {t.dtype}")
    # HummingLayer is a dataclass nn.Module: (shape_n, shape_k, weight_config, input_config=None,
    # pad_n_to_multiple=1, pad_k_to_multiple=1, num_experts=None, has_bias=False, torch_dtype=None)
    with torch.device(DEV):
        layer = HummingLayer(shape_n=n, shape_k=k, weight_config=schema, num_experts=E,
                             torch_dtype=torch.bfloat16)
    if verbose:
        log("    HummingLayer params: " + ", ".join(
            f"{name} {tuple(p.shape)} {p.dtype}" for name, p in layer.named_parameters()))
    layer.load_from_tensors(tensors)
    return layer, (codes, scale, gscale), schema


# ----------------------------------------------------------------------------- small ops
@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, D, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    g = tl.load(x_ptr + row * 2 * D + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * D + D + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr + row * D + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul(x, out):
    t, d2 = x.shape
    d = d2 // 2
    block = min(1024, triton.next_power_of_2(d))
    _silu_mul_kernel[(t, triton.cdiv(d, block))](x, out, d, BLOCK=block, num_warps=4)
    return out


# humming.ops.moe_fused_mul_sum (July tree, humming/ops/moe.py) is gone from 0.1.20: the same
# Triton kernel and tile heuristic, vendored, so the combine step costs what it cost in July.
@triton.jit
def _moe_fused_mul_sum_kernel(inputs_ptr, topk_weights_ptr, outputs_ptr, num_tokens, stride_m,
                              top_k: tl.constexpr, size: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    m_mask = offs_m < num_tokens
    k_mask = offs_k < size
    mask = m_mask[:, None] & k_mask[None, :]
    a_base = inputs_ptr + (offs_m * stride_m)[:, None] + offs_k[None, :]
    b_base = topk_weights_ptr + offs_m * top_k
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n in tl.static_range(top_k):
        b_val = tl.load(b_base + n, mask=m_mask, other=0.0).to(tl.float32)
        a_vec = tl.load(a_base + n * size, mask=mask, other=0.0).to(tl.float32)
        acc += a_vec * b_val[:, None]
    out_ptrs = outputs_ptr + (offs_m * size)[:, None] + offs_k[None, :]
    tl.store(out_ptrs, acc.to(outputs_ptr.dtype.element_ty), mask=mask)


def _mul_sum_config(num_tokens, size, element_size, sm_major):
    is_fp32 = element_size > 2
    if sm_major >= 9:
        if is_fp32:
            block_m = 1 if num_tokens <= 4 else 2
        else:
            block_m = 1 if num_tokens <= 4 else (2 if num_tokens <= 128 else 4)
    elif is_fp32:
        block_m = 1 if num_tokens <= 4 else (2 if num_tokens <= 32 else 4)
    else:
        if num_tokens <= 4:
            block_m = 1
        elif num_tokens <= 32:
            block_m = 2
        elif num_tokens <= 128:
            block_m = 4
        elif num_tokens <= 1024:
            block_m = 16
        else:
            block_m = 8
    max_block_k = 256 if is_fp32 else (512 if (sm_major <= 7 or sm_major >= 9) else 1024)
    block_k = max(min(triton.next_power_of_2(size), max_block_k), 256)
    total = block_m * block_k
    num_warps = max(8, min(16, total // 64)) if is_fp32 else max(4, min(16, total // 256))
    if sm_major <= 7:
        num_warps, num_stages = min(num_warps, 8), 2
    elif sm_major >= 9:
        num_warps, num_stages = min(num_warps, 8), (4 if total <= 2048 else 2)
    else:
        num_stages = 4 if total <= 2048 else 2
    return block_m, block_k, num_warps, num_stages


def _moe_fused_mul_sum_vendored(inputs, topk_weights, outputs=None):
    assert inputs.ndim == 3 and topk_weights.ndim == 2
    assert inputs.is_contiguous() and topk_weights.is_contiguous()
    num_tokens, top_k, size = inputs.shape
    if outputs is None:
        outputs = torch.empty((num_tokens, size), dtype=inputs.dtype, device=inputs.device)
    assert outputs.shape == (num_tokens, size) and topk_weights.shape == (num_tokens, top_k)
    bm, bk, nw, ns = _mul_sum_config(num_tokens, size, inputs.element_size(), PROPS.major)
    grid = (triton.cdiv(size, bk), triton.cdiv(num_tokens, bm))
    _moe_fused_mul_sum_kernel[grid](inputs, topk_weights, outputs, num_tokens, top_k * size,
                                    top_k, size, bm, bk, num_warps=nw, num_stages=ns)
    return outputs


if hasattr(hops, "moe_fused_mul_sum"):
    moe_fused_mul_sum = hops.moe_fused_mul_sum
    MUL_SUM_SOURCE = "humming.ops.moe_fused_mul_sum"
else:
    moe_fused_mul_sum = _moe_fused_mul_sum_vendored
    MUL_SUM_SOURCE = "vendored copy of the July humming.ops.moe_fused_mul_sum (absent from 0.1.20)"


def moe_align(topk_ids, block):
    """sorted_ids / expert_ids / num_tokens_padded for Humming's indexed GEMM
    (same semantics as humming.testing.data.generate_moe_tensors(gemm_type='indexed'), vectorized:
    per expert, its flat (token*topk+k) ids padded to a multiple of block with the sentinel
    M*topk; expert_ids one entry per block; int32 everywhere)."""
    flat = topk_ids.reshape(-1).long()
    t = flat.numel()
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(padded, 0) - padded
    total = int(padded.sum().item())
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    cstart = torch.cumsum(counts, 0) - counts
    rank = torch.arange(t, device=DEV) - cstart[se]
    sorted_ids = torch.full((total,), t, dtype=torch.int32, device=DEV)
    sorted_ids[starts[se] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(E, device=DEV), padded // block).to(torch.int32)
    ntp = torch.tensor([total], dtype=torch.int32, device=DEV)
    return sorted_ids, expert_ids, ntp


# ----------------------------------------------------------------------------- tuning
def tuning_list(layer_config, gemm_type, routed_list):
    """Humming's own SM90 heuristic configs, restricted to the routed row counts we run.
    Ranges are (lo, hi] of routed rows, as the launcher (find_kernel_configs_target_index) reads
    them: it picks the entry with lo < M*topk <= hi."""
    rs = sorted(set(routed_list))
    out, lo = [], 0
    for i, r in enumerate(rs):
        # get_heuristics_config(layer_config, shape_m=None, use_f16_accum=False,
        #   use_batch_invariant=False, use_m_major_input_scale=False, gemm_type="dense", device=None)
        cfg = json.loads(json.dumps(get_heuristics_config(layer_config, shape_m=r, gemm_type=gemm_type)))
        if args.stream_k == "off":
            cfg["use_stream_k"] = False
        hi = (1 << 30) if i == len(rs) - 1 else r
        out.append([lo, hi, cfg])
        lo = r
    return out


def cfg_for(tlist, r):
    for lo, hi, cfg in tlist:
        if lo < r <= hi:
            return cfg
    raise KeyError(r)


def prepare_kernels(layer, compute_str, tuning_str):
    """JIT-compile + register the kernels exactly as HummingLayer.forward -> humming_forward ->
    ops.humming_gemm would on its first call (HummingKernel.prepare_kernels caches the resulting
    [lo, hi, kernel_id, num_sms]* tensor under (layer_str, compute_str, tuning_str, device))."""
    return HummingKernel.prepare_kernels(layer.humming_config.to_str(), compute_str, tuning_str,
                                         DEV.index)


def bench_us(fn, warmup=None, rep=None):
    return triton.testing.do_bench(fn, warmup=args.warmup_ms if warmup is None else warmup,
                                   rep=args.rep_ms if rep is None else rep,
                                   return_mode="median") * 1000.0


def capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def rel_err(out, ref):
    out = out.float()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


CC = {"indexed": json.dumps({"gemm_type": "indexed"}),
      "grouped": json.dumps({"gemm_type": "grouped_contiguous"})}
GTYPE = {"indexed": GemmType.INDEXED, "grouped": GemmType.GROUPED_CONTIGUOUS}


def make_routing(m, seed):
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    x = torch.randn((m, H), device=DEV, generator=g).to(torch.bfloat16)
    logits = torch.randn((m, E), device=DEV, generator=g)
    topk_w, topk_ids = torch.topk(torch.softmax(logits, dim=-1), TOPK, dim=-1)
    topk_w = (topk_w / topk_w.sum(-1, keepdim=True)).float().contiguous()
    topk_ids = topk_ids.to(torch.int32).contiguous()
    return x, topk_w, topk_ids


def reference(L, inter, x, topk_w, topk_ids):
    """float32 reference (intermediates rounded to bf16 like the kernels' outputs)."""
    m = x.shape[0]
    t = m * TOPK
    flat = topk_ids.reshape(-1).long()
    ref_h1 = torch.empty((t, 2 * inter), device=DEV, dtype=torch.float32)
    ref_act = torch.empty((t, inter), device=DEV, dtype=torch.float32)
    ref_h2 = torch.empty((t, H), device=DEV, dtype=torch.float32)
    ref = torch.zeros((m, H), device=DEV, dtype=torch.float32)
    xf = x.float()
    for e in torch.unique(flat).tolist():
        slots = torch.nonzero(flat == e).squeeze(1)
        tok = slots // TOPK
        h1 = (xf[tok] @ dequant_expert(*L["w1"], e).T).to(torch.bfloat16).float()
        ref_h1[slots] = h1
        a = (torch.nn.functional.silu(h1[:, :inter]) * h1[:, inter:]).to(torch.bfloat16).float()
        h2 = (a @ dequant_expert(*L["w2"], e).T).to(torch.bfloat16).float()
        ref_act[slots] = a
        ref_h2[slots] = h2
        ref.index_add_(0, tok, h2 * topk_w.reshape(-1)[slots].unsqueeze(1))
    return ref_h1, ref_act, ref_h2, ref


def make_case(L, inter, lay_name, x, topk_w, topk_ids):
    """Buffers, routing metadata (built here, untimed) and the callables of one case."""
    m = x.shape[0]
    t = m * TOPK
    fc1, fc2 = L["fc1"], L["fc2"]
    flat = topk_ids.reshape(-1).long()
    tl1, tl2 = L[("fc1", lay_name)], L[("fc2", lay_name)]
    c1, c2 = cfg_for(tl1, t), cfg_for(tl2, t)
    s1, s2 = L[("fc1", lay_name, "str")], L[("fc2", lay_name, "str")]
    cc = CC[lay_name]
    h1b = torch.empty((t, 2 * inter), device=DEV, dtype=torch.bfloat16)
    ab = torch.empty((t, inter), device=DEV, dtype=torch.bfloat16)
    h2b = torch.empty((t, H), device=DEV, dtype=torch.bfloat16)
    outb = torch.empty((m, H), device=DEV, dtype=torch.bfloat16)
    if lay_name == "indexed":
        sid1, eid1, ntp1 = moe_align(topk_ids, c1["block_shape"][0])
        if c2["block_shape"][0] == c1["block_shape"][0]:
            sid2, eid2, ntp2 = sid1, eid1, ntp1
        else:
            sid2, eid2, ntp2 = moe_align(topk_ids, c2["block_shape"][0])

        def fc1_call():
            return fc1(inputs=x, outputs=h1b, sorted_ids=sid1, expert_ids=eid1,
                       num_tokens_padded=ntp1, top_k=TOPK,
                       compute_config=cc, tuning_config=s1)

        def fc2_call():
            return fc2(inputs=ab, outputs=h2b, sorted_ids=sid2, expert_ids=eid2,
                       num_tokens_padded=ntp2, top_k=1,
                       compute_config=cc, tuning_config=s2)

        def full():
            fc1_call()
            silu_mul(h1b, ab)
            fc2_call()
            moe_fused_mul_sum(h2b.view(m, TOPK, H), topk_w, outputs=outb)

        h1_order = None

        def prep():
            pass
    else:
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        offs = torch.zeros((E + 1,), dtype=torch.int64, device=DEV)
        offs[1:] = torch.cumsum(counts, 0)
        tok_sorted = (order // TOPK).contiguous()
        xs = torch.empty((t, H), device=DEV, dtype=torch.bfloat16)
        yb = torch.empty((t, H), device=DEV, dtype=torch.bfloat16)

        def fc1_call():
            return fc1(inputs=xs, outputs=h1b, expert_layout=offs,
                       compute_config=cc, tuning_config=s1)

        def fc2_call():
            return fc2(inputs=ab, outputs=h2b, expert_layout=offs,
                       compute_config=cc, tuning_config=s2)

        def full():
            torch.index_select(x, 0, tok_sorted, out=xs)
            fc1_call()
            silu_mul(h1b, ab)
            fc2_call()
            yb.index_copy_(0, order, h2b)
            moe_fused_mul_sum(yb.view(m, TOPK, H), topk_w, outputs=outb)

        h1_order = order

        def prep():
            torch.index_select(x, 0, tok_sorted, out=xs)

    return dict(c1=c1, c2=c2, h1b=h1b, ab=ab, h2b=h2b, outb=outb, fc1_call=fc1_call,
                fc2_call=fc2_call, full=full, prep=prep, h1_order=h1_order)


def build_layers(inters, gen, routed, layouts, verbose=False):
    """Weights -> HummingLayer -> transform() -> heuristic tuning lists; returns layers dict."""
    layers = {}
    schema = None
    for inter in inters:
        if verbose:
            step(f"random ModelOpt NVFP4 weights + ModeloptNvfp4WeightSchema.convert_humming + "
                 f"HummingLayer(...) + load_from_tensors: FC1 [E={E}, {2 * inter}, {H}]")
        fc1, w1, schema = make_layer(2 * inter, H, gen, verbose)
        if verbose:
            step(f"same for FC2 [E={E}, {H}, {inter}]")
        fc2, w2, _ = make_layer(H, inter, gen, verbose)
        layers[inter] = dict(fc1=fc1, fc2=fc2, w1=w1, w2=w2)
    log(f"weights generated: H={H} I={list(inters)} E={E} topk={TOPK}; schema={schema}")

    t_r0 = time.time()
    for inter, L in layers.items():
        for name in ("fc1", "fc2"):
            if verbose:
                step(f"HummingLayer.transform() {name} (repack to Humming layout; JITs the repack kernel)")
            L[name].transform()
            if verbose:
                lay = L[name]
                log(f"    humming_config: {lay.humming_config.to_str()}")
                log("    params after transform: " + ", ".join(
                    f"{n} {tuple(p.shape)} {p.dtype}" for n, p in lay.named_parameters()))
    torch.cuda.synchronize()
    log(f"weights transformed to Humming layout in {time.time() - t_r0:.1f}s"
        + (f" (float8 insurance used {INSURANCE_USED[0]}x)" if INSURANCE_USED[0] else ""))

    for inter, L in layers.items():
        for name in ("fc1", "fc2"):
            cfg_layer = L[name].humming_config
            for lay_name in layouts:
                if verbose:
                    step(f"get_heuristics_config({name}, shape_m in {sorted(set(routed))}, "
                         f"gemm_type={GTYPE[lay_name].value})")
                tlist = tuning_list(cfg_layer, GTYPE[lay_name], routed)
                L[(name, lay_name)] = tlist
                L[(name, lay_name, "str")] = json.dumps(tlist)
                if verbose:
                    for lo, hi, cfg in tlist:
                        log(f"    ({lo}, {hi}]: {json.dumps(cfg)}")
    return layers


def compile_all(layers, layouts, verbose=False):
    """Phase A: compile every needed GEMM kernel (JIT, NVRTC/NVCC) before anything is timed."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = []
    for inter, L in layers.items():
        for name in ("fc1", "fc2"):
            for lay_name in layouts:
                jobs.append(((inter, name, lay_name), L[name], CC[lay_name], L[(name, lay_name, "str")]))
    n_kernels = sum(len(L[(j[0][1], j[0][2])]) for j in jobs for L in [layers[j[0][0]]])
    log(f"compiling {n_kernels} Humming GEMM kernel configs ({len(jobs)} prepare_kernels calls) ...")
    t_c0 = time.time()
    dev_index = DEV.index
    compile_err = {}
    registered = {}

    def build(job):
        key, layer, cc, ts = job
        try:
            return key, prepare_kernels(layer, cc, ts), None
        except Exception as e:  # noqa: BLE001
            return key, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"

    if verbose:
        step("init_humming_launcher() (precompiled launcher for torch>=2.11, else JIT-built)")
    init_humming_launcher()
    if verbose:
        step("HummingKernel.prepare_kernels(layer_config_str, compute_config_str, tuning_config_str, dev) "
             "for every (layer, layout)")
    workers = max(1, min(len(jobs), 4))
    with ThreadPoolExecutor(max_workers=workers, initializer=torch.cuda.set_device,
                            initargs=(dev_index,)) as ex:
        for key, res, err in ex.map(build, jobs):
            if err:
                compile_err[str(key)] = err
            else:
                registered[key] = res.tolist()
                if verbose:
                    log(f"    {key}: [lo, hi, kernel_id, num_sms]* = {res.tolist()}")
    compile_s = time.time() - t_c0
    log(f"compiled/registered {sum(len(v) // 4 for v in registered.values())} kernels in "
        f"{compile_s:.1f}s; {len(compile_err)} prepare_kernels calls failed")
    for key, err in list(compile_err.items())[:4]:
        log(f"  compile failure {key}: {err[:800]}")
    return compile_s, compile_err


# ============================================================================== selftest
def selftest():
    """One small MoE layer, each API step once, checked against the reference."""
    inter = args.inter[0]
    m = args.selftest_tokens
    t = m * TOPK
    thr = 2e-2
    ok = True
    log(f"selftest-api: H={H} I={inter} E={E} topk={TOPK} M={m} layouts={args.layouts} "
        f"combine={MUL_SUM_SOURCE}")
    try:
        gen = torch.Generator(device=DEV)
        gen.manual_seed(args.seed)
        layers = build_layers([inter], gen, [t], args.layouts, verbose=True)
        L = layers[inter]
        compile_s, compile_err = compile_all(layers, args.layouts, verbose=True)
        if compile_err:
            raise RuntimeError(f"prepare_kernels failed: {list(compile_err.values())[0][:1500]}")
        step("routing (random top-k) + float32 dequantized reference")
        x, topk_w, topk_ids = make_routing(m, args.seed + 1)
        ref_h1, ref_act, ref_h2, ref = reference(L, inter, x, topk_w, topk_ids)
        log(f"    experts hit: {torch.unique(topk_ids).numel()}  ||ref||={ref.norm().item():.3e}")
        for lay_name in args.layouts:
            step(f"[{lay_name}] routing metadata ({'moe_align -> sorted_ids/expert_ids/num_tokens_padded' if lay_name == 'indexed' else 'argsort + expert_layout offsets (int64, E+1)'})")
            cs = make_case(L, inter, lay_name, x, topk_w, topk_ids)
            log(f"    fc1 cfg block_shape={cs['c1']['block_shape']}  fc2 cfg block_shape={cs['c2']['block_shape']}")
            o = cs["h1_order"]
            r_h1 = ref_h1 if o is None else ref_h1[o]
            r_act = (ref_act if o is None else ref_act[o]).to(torch.bfloat16)
            r_h2 = ref_h2 if o is None else ref_h2[o]

            step(f"[{lay_name}] FC1 HummingLayer.forward (gate_up, {t} routed rows)")
            cs["prep"]()
            cs["fc1_call"]()
            torch.cuda.synchronize()
            e1 = rel_err(cs["h1b"], r_h1)
            log(f"    FC1 rel err {e1:.3e} {'OK' if e1 < thr else 'BAD'}")
            ok &= e1 < thr

            step(f"[{lay_name}] SwiGLU (Triton) on FC1 output")
            silu_mul(cs["h1b"], cs["ab"])
            torch.cuda.synchronize()

            step(f"[{lay_name}] FC2 HummingLayer.forward (down) on the reference activation")
            cs["ab"].copy_(r_act)
            cs["fc2_call"]()
            torch.cuda.synchronize()
            e2 = rel_err(cs["h2b"], r_h2)
            log(f"    FC2 rel err {e2:.3e} {'OK' if e2 < thr else 'BAD'}")
            ok &= e2 < thr

            step(f"[{lay_name}] full MoE eager (FC1 -> SwiGLU -> FC2 -> moe_fused_mul_sum)")
            cs["full"]()
            torch.cuda.synchronize()
            ef = rel_err(cs["outb"], ref)
            log(f"    full rel err {ef:.3e} {'OK' if ef < thr else 'BAD'}")
            ok &= ef < thr

            step(f"[{lay_name}] CUDA graph capture + replay of the full MoE")
            cs["outb"].zero_()
            gr = capture(cs["full"])
            cs["outb"].zero_()
            gr.replay()
            torch.cuda.synchronize()
            eg = rel_err(cs["outb"], ref)
            log(f"    graph rel err {eg:.3e} {'OK' if eg < thr else 'BAD'}")
            ok &= eg < thr

            step(f"[{lay_name}] triton.testing.do_bench of the graph replay (short)")
            us = bench_us(gr.replay, warmup=5, rep=20)
            log(f"    {us:.1f} us (small E={E}; not a benchmark number)")
            del gr
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        log(f"SELFTEST FAILED at api step {STEP[0]}: {type(e).__name__}: {str(e)[:1500]}")
        return 2
    log(f"SELFTEST {'PASSED' if ok else 'FAILED (numerics)'}: {STEP[0]} api steps, threshold rel err < {thr}")
    return 0 if ok else 1


# ============================================================================== main
def main():
    if SELFTEST:
        return selftest()
    out_dir = os.environ.get("OUT")
    json_path = args.json or (os.path.join(out_dir, "humming.json") if out_dir else None)
    gen = torch.Generator(device=DEV)
    gen.manual_seed(args.seed)
    routed = [m * TOPK for m in args.tokens]

    # ---- layers (weights, transformed) and tuning configs
    layers = build_layers(args.inter, gen, routed, args.layouts)

    # ---- phase A: compile every needed GEMM kernel
    compile_s, compile_err = compile_all(layers, args.layouts)

    results = []
    meta_info = {
        "device": PROPS.name, "sm": f"{PROPS.major}{PROPS.minor}", "num_sms": PROPS.multi_processor_count,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
        "humming_version": HUMMING_VERSION,
        "humming_source": open(os.path.join(HUMMING_SRC, "SOURCE.txt")).read()
        if os.path.exists(os.path.join(HUMMING_SRC, "SOURCE.txt")) else None,
        "compiler": os.environ.get("HUMMING_COMPILER", "auto"),
        "H": H, "I": args.inter, "E": E, "topk": TOPK, "tokens": args.tokens,
        "layouts": args.layouts, "weights": "NVFP4: e2m1 + e4m3 group-16 scale + fp32 per-expert global",
        "activations": "bf16", "timing": f"triton do_bench median, warmup {args.warmup_ms} ms, "
        f"rep {args.rep_ms} ms, L2 flushed before every call", "compile_s": compile_s,
        "compile_failures": list(compile_err.values()),
        "combine": MUL_SUM_SOURCE, "float8_insurance_used": INSURANCE_USED[0],
    }

    def dump():
        if not json_path:
            return
        with open(json_path, "w") as f:
            json.dump({"meta": meta_info, "results": results, "elapsed_s": time.time() - T0}, f, indent=1)

    dump()

    # ---- phase B: cases
    for inter in args.inter:
        L = layers[inter]
        bpe = weight_bytes_per_expert(2 * inter, H) + weight_bytes_per_expert(H, inter)
        for m in args.tokens:
            if time.time() - T0 > args.time_budget:
                log(f"time budget reached; skipping I={inter} M={m} and later")
                break
            t = m * TOPK
            x, topk_w, topk_ids = make_routing(m, args.seed * 1000 + inter * 10 + m)
            n_hit = torch.unique(topk_ids.reshape(-1)).numel()
            ref_h1, ref_act, ref_h2, ref = reference(L, inter, x, topk_w, topk_ids)

            for lay_name in args.layouts:
                rec = {"I": inter, "M": m, "layout": lay_name, "routed_rows": t, "experts_hit": n_hit,
                       "weight_bytes": n_hit * bpe}
                try:
                    cs = make_case(L, inter, lay_name, x, topk_w, topk_ids)
                    c1, c2 = cs["c1"], cs["c2"]
                    rec["fc1_config"], rec["fc2_config"] = c1, c2
                    h1b, ab, h2b, outb = cs["h1b"], cs["ab"], cs["h2b"], cs["outb"]
                    fc1_call, fc2_call, full, prep = cs["fc1_call"], cs["fc2_call"], cs["full"], cs["prep"]
                    h1_order = cs["h1_order"]

                    full()
                    torch.cuda.synchronize()
                    rec["rel_err"] = rel_err(outb, ref)
                    rec["rel_err_fc1"] = rel_err(h1b, ref_h1 if h1_order is None else ref_h1[h1_order])
                    r_h1 = ref_h1 if h1_order is None else ref_h1[h1_order]
                    r_act = (ref_act if h1_order is None else ref_act[h1_order]).to(torch.bfloat16)
                    r_h2 = ref_h2 if h1_order is None else ref_h2[h1_order]
                    e_full, e1, e2 = [rec["rel_err"]], [rec["rel_err_fc1"]], []
                    for _ in range(max(0, args.check_repeats)):
                        prep()
                        fc1_call()
                        torch.cuda.synchronize()
                        e1.append(rel_err(h1b, r_h1))
                        ab.copy_(r_act)
                        fc2_call()
                        torch.cuda.synchronize()
                        e2.append(rel_err(h2b, r_h2))
                        full()
                        torch.cuda.synchronize()
                        e_full.append(rel_err(outb, ref))
                    rec["rel_err_runs"], rec["rel_err_fc1_runs"], rec["rel_err_fc2_runs"] = e_full, e1, e2
                    del r_h1, r_act, r_h2
                    rec["time_us_eager"] = bench_us(full)
                    rec["time_us_graph"] = None
                    if not args.no_graph:
                        try:
                            gr = capture(full)
                            rec["time_us_graph"] = bench_us(gr.replay)
                            gr.replay()
                            torch.cuda.synchronize()
                            rec["rel_err_graph"] = rel_err(outb, ref)
                            if not args.no_parts:
                                g1 = capture(fc1_call)
                                rec["fc1_us"] = bench_us(g1.replay)
                                g2 = capture(fc2_call)
                                rec["fc2_us"] = bench_us(g2.replay)
                                del g1, g2
                            del gr
                        except Exception as e:  # noqa: BLE001
                            rec["graph_error"] = f"{type(e).__name__}: {e}"[:500]
                    if rec.get("fc1_us") is None and not args.no_parts:
                        rec["fc1_us"] = bench_us(fc1_call)
                        rec["fc2_us"] = bench_us(fc2_call)
                    errs = rec["rel_err_runs"] + ([rec["rel_err_graph"]] if "rel_err_graph" in rec else [])
                    rec["rel_err_max"] = max(errs)
                    rec["rel_err_fc1_max"] = max(rec["rel_err_fc1_runs"])
                    rec["rel_err_fc2_max"] = max(rec["rel_err_fc2_runs"]) if rec["rel_err_fc2_runs"] else None
                    best = rec["time_us_graph"] or rec["time_us_eager"]
                    rec["time_us"] = best
                    rec["gbps"] = rec["weight_bytes"] / (best * 1e-6) / 1e9
                    log(f"I={inter:5d} M={m:5d} {lay_name:8s} experts={n_hit:3d} "
                        f"t={best:9.1f}us (eager {rec['time_us_eager']:.1f}) "
                        f"fc1={rec.get('fc1_us', float('nan')):.1f} fc2={rec.get('fc2_us', float('nan')):.1f} "
                        f"{rec['gbps']:7.0f} GB/s  rel_err first={rec['rel_err']:.2e} max={rec['rel_err_max']:.2e} "
                        f"(fc1 max {rec['rel_err_fc1_max']:.2e}, fc2 max {rec['rel_err_fc2_max'] or float('nan'):.2e}) "
                        f"bm1={c1['block_shape']} bm2={c2['block_shape']}")
                    del cs, fc1_call, fc2_call, full, prep
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {e}"[:1500]
                    log(f"I={inter} M={m} {lay_name}: FAILED {rec['error'][:400]}")
                    traceback.print_exc()
                    torch.cuda.synchronize()
                results.append(rec)
                dump()
            del ref_h1, ref_act, ref_h2, ref
            torch.cuda.empty_cache()

    # ---- table
    print("\nHumming NVFP4 W4A16 MoE  (H=%d, E=%d, top-%d; FC1 gate_up [E,2I,H] + SwiGLU + FC2 down "
          "[E,H,I] + top-k sum; %s; humming %s)" % (H, E, TOPK, PROPS.name, HUMMING_VERSION))
    print("time = median CUDA-graph replay (L2 cold); GB/s = NVFP4 weight+scale bytes of the experts hit / time")
    print(f"rel err = worst ||out-ref||/||ref|| over {1 + args.check_repeats} eager runs + 1 graph replay; "
          f"fc1/fc2 err = worst per-GEMM error (FC2 fed the reference activation); stream-k={args.stream_k}")
    hdr = f"{'M':>5} {'I':>5} {'layout':>8} {'hit':>4} {'time us':>9} {'GB/s':>7} {'rel err':>9} " \
          f"{'fc1 err':>9} {'fc2 err':>9} {'fc1 us':>8} {'fc2 us':>8} {'eager us':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if "error" in r:
            print(f"{r['M']:>5} {r['I']:>5} {r['layout']:>8}  ERROR: {r['error'][:90]}")
            continue
        print(f"{r['M']:>5} {r['I']:>5} {r['layout']:>8} {r['experts_hit']:>4} {r['time_us']:>9.1f} "
              f"{r['gbps']:>7.0f} {r['rel_err_max']:>9.2e} {r['rel_err_fc1_max']:>9.2e} "
              f"{r['rel_err_fc2_max'] or float('nan'):>9.2e} {r.get('fc1_us', float('nan')):>8.1f} "
              f"{r.get('fc2_us', float('nan')):>8.1f} {r['time_us_eager']:>9.1f}")
    bad = [r for r in results if "error" in r or r["rel_err_max"] >= 2e-2]
    for r in bad:
        if "error" not in r:
            print(f"  CHECK I={r['I']} M={r['M']} {r['layout']}: full {['%.1e' % v for v in r['rel_err_runs']]} "
                  f"graph {r.get('rel_err_graph', float('nan')):.1e} fc1 {['%.1e' % v for v in r['rel_err_fc1_runs']]} "
                  f"fc2 {['%.1e' % v for v in r['rel_err_fc2_runs']]}")
    ok = not bad and len(results) > 0
    print(f"\ncorrectness: {'PASS' if ok else 'CHECK'} (threshold rel err < 2e-2); "
          f"compile {compile_s:.0f}s; total {time.time() - T0:.0f}s")
    meta_info["total_s"] = time.time() - T0
    dump()
    if json_path:
        log(f"wrote {json_path}")
    if args.save_cache and out_dir:
        import tarfile
        cache = os.environ["HUMMING_CACHE_DIR"]
        tgz = os.path.join(out_dir, "humming_cache.tgz")
        with tarfile.open(tgz, "w:gz") as tf:
            tf.add(cache, arcname="humming_cache")
        if os.path.getsize(tgz) > 15 * 1024 * 1024:
            os.unlink(tgz)
            log("cache tarball > 15 MB; not kept")
        else:
            log(f"cache saved to {tgz} ({os.path.getsize(tgz) / 1e6:.1f} MB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
