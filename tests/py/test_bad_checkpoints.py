"""Broken checkpoints: `fp4moe inspect` (and `layer`) must fail cleanly on each.

Each test copies a generated tiny model (ModelOpt, static A4, sharded), breaks one thing the
way a bad download or a bad exporter would, and checks: exit status 1 (an error exit, never a
signal or a usage error), a message on stderr naming the file / tensor / key with what was
expected and what was found, and that the tool changed none of the input files (sha256 of
every file before and after). Shard edits rewrite the header by hand (safetensors layout:
u64 LE header length, JSON header, data buffer) or with the python `safetensors` package.
"""
import json
import os
import struct

import numpy as np
import pytest
import safetensors.numpy as stn

from conftest import copy_model, model_shards, read_st, run, st_header, tree_hashes

EXPERT = "model.layers.1.block_sparse_moe.experts.3"


@pytest.fixture
def model(gen_tiny, tmp_path):
    return copy_model(gen_tiny("modelopt", "static", 400000), tmp_path / "m")


def shard_of(d, name):
    _, wm = model_shards(d)
    return os.path.join(d, wm[name])


def write_header(path, header):
    """Replace the JSON header of a safetensors file, keeping its data buffer."""
    _, _, start = st_header(path)
    data = open(path, "rb").read()[start:]
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def edit_header(path, fn):
    _, h, _ = st_header(path)
    fn(h)
    write_header(path, h)


def fails(args, *needles, tool_cmd="inspect"):
    """Run the tool on a broken model: rc 1, every needle on stderr, inputs unchanged."""
    d = args[0]
    before = tree_hashes(d)
    r = run(tool_cmd, *args)
    assert r.rc == 1, str(r)
    assert r.err.startswith(f"fp4moe {tool_cmd}: error: "), str(r)
    for n in needles:
        assert n in r.err, f"expected {n!r} in stderr\n{r}"
    assert tree_hashes(d) == before, "the tool modified its input"
    return r


def test_good_copy_passes(model):
    run("inspect", model, check=0)


def test_truncated_shard(model):
    p = shard_of(model, EXPERT + ".w1.weight")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 1000)
    fails([model], os.path.basename(p), str(size - 1000 - st_header(p)[2]))


def test_header_length_past_end(model):
    p = shard_of(model, EXPERT + ".w1.weight")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", size + 100))
    fails([model], os.path.basename(p), "header length", str(size + 100), str(size))


def test_header_length_over_cap(model):
    p = shard_of(model, EXPERT + ".w1.weight")
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", 200_000_000))
    fails([model], os.path.basename(p), "header length 200000000", "limit of 104857600")


def test_broken_header_json(model):
    p = shard_of(model, EXPERT + ".w1.weight")
    raw = bytearray(open(p, "rb").read())
    i = raw.index(b'"dtype":')
    raw[i + 7] = ord("=")  # "dtype"= ...
    open(p, "wb").write(raw)
    fails([model], os.path.basename(p), "not valid JSON", "near byte")


def test_unknown_dtype(model):
    name = EXPERT + ".w1.weight_scale"
    p = shard_of(model, name)
    edit_header(p, lambda h: h[name].update(dtype="F8_E4M3FNUZZ"))
    fails([model], os.path.basename(p), name, "unknown dtype \"F8_E4M3FNUZZ\"", "F8_E4M3,")


def test_shape_disagrees_with_byte_span(model):
    name = EXPERT + ".w3.weight"
    p = shard_of(model, name)
    _, h, _ = st_header(p)
    assert h[name]["shape"] == [128, 128]
    edit_header(p, lambda h: h[name].update(shape=[128, 130]))
    fails([model], os.path.basename(p), name, "[128, 130]", "16640", "16384")


def test_offset_past_end(model):
    name = EXPERT + ".w2.weight"
    p = shard_of(model, name)
    _, h, start = st_header(p)
    buf = os.path.getsize(p) - start
    b, e = h[name]["data_offsets"]

    def push(h):
        h[name]["data_offsets"] = [buf + 64, buf + 64 + (e - b)]
    edit_header(p, push)
    fails([model], os.path.basename(p), name, str(buf + 64), f"data buffer of {buf} bytes")


def test_missing_shard(model):
    p = shard_of(model, EXPERT + ".w1.weight")
    os.remove(p)
    r = fails([model], os.path.basename(p), "missing")
    fails([model, "--layer", 1, "--input", "/nonexistent", "--output", "/nonexistent"],
          os.path.basename(p), tool_cmd="layer")
    assert "index" in r.err


@pytest.mark.parametrize("in_index", [True, False], ids=["index-lists-it", "index-updated"])
def test_promised_tensor_removed(model, in_index, tmp_path):
    name = EXPERT + ".w1.weight"
    p = shard_of(model, name)
    tensors = read_st(p)
    del tensors[name]
    stn.save_file(tensors, p, metadata={"format": "pt"})  # rewritten by python safetensors
    if not in_index:
        ip = os.path.join(model, "model.safetensors.index.json")
        idx = json.load(open(ip))
        del idx["weight_map"][name]
        json.dump(idx, open(ip, "w"))
        fails([model], name, "missing")
    else:
        fails([model], name, os.path.basename(p))
    # `layer` reports the same tensor
    x = tmp_path / "x.safetensors"
    stn.save_file({"x": np.ones((2, 256), np.float32)}, str(x))
    fails([model, "--layer", 1, "--input", x, "--output", tmp_path / "y.safetensors"], name,
          tool_cmd="layer")
    assert not os.path.exists(tmp_path / "y.safetensors")


def test_unknown_quant_algo(model):
    p = os.path.join(model, "hf_quant_config.json")
    q = json.load(open(p))
    key = "model.layers.2.block_sparse_moe.experts.0.w2"
    q["quantization"]["quantized_layers"][key]["quant_algo"] = "NVFP3"
    json.dump(q, open(p, "w"), indent=1)
    fails([model], "hf_quant_config.json", "NVFP3", key + ".quant_algo", "expected one of", "W4A16_NVFP4")


def test_unknown_top_level_quant_algo(model):
    p = os.path.join(model, "hf_quant_config.json")
    q = json.load(open(p))
    q["quantization"] = {"quant_algo": "INT3_AWQ", "group_size": 16}
    json.dump(q, open(p, "w"))
    fails([model], "hf_quant_config.json", "INT3_AWQ", "quantization.quant_algo", "expected one of")


def test_broken_config_json(model):
    p = os.path.join(model, "config.json")
    text = open(p).read()
    open(p, "w").write(text[: len(text) // 2])
    fails([model], "config.json", "invalid JSON near byte")


def test_config_key_wrong_type(model):
    p = os.path.join(model, "config.json")
    c = json.load(open(p))
    c["num_local_experts"] = "eight"
    json.dump(c, open(p, "w"))
    fails([model], "config.json", "num_local_experts", '"eight"', "expected")


def test_missing_config_json(model):
    os.remove(os.path.join(model, "config.json"))
    fails([model], "config.json", "No such file")


@pytest.mark.parametrize("suffix,new,want", [
    ("weight_scale", "I8", "F8_E4M3"),       # e4m3 block scales stored as int8
    ("weight_scale_2", "I32", "F32"),        # fp32 global scale stored as int32
    ("input_scale", "U32", "F32"),           # static input scale stored as uint32
])
def test_wrong_scale_dtype(model, suffix, new, want, tmp_path):
    name = f"{EXPERT}.w2.{suffix}"
    p = shard_of(model, name)
    edit_header(p, lambda h: h[name].update(dtype=new))
    fails([model], name, want, new)
    x = tmp_path / "x.safetensors"
    stn.save_file({"x": np.ones((2, 256), np.float32)}, str(x))
    fails([model, "--layer", 1, "--input", x, "--output", tmp_path / "y.safetensors"], name, new,
          tool_cmd="layer")
