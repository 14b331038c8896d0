"""Property-based fuzz of the whole command line, in process (planner.cli.main).

argv for `estimate` and `recommend` (and now and then `validate`) is drawn from the frozen flag
surface (tests/test_cli.py FROZEN, read back from the parser here) with values that are valid
(catalog models, GPU names, sensible layouts), on a boundary (0, 1, every limit of
planner/bounds.py and just beyond) or hostile ('1e309', 'nan', '9'*40, unicode, ...), and
--model config.json files that are valid or broken (5000-level nesting, > 4 MiB, NaN literals,
wrong types, missing fields, a directory, non-UTF-8).

The property: every input ends either
  (a) with exit 0 and, with --json, a JSON answer whose numbers are all finite and non-negative
      and whose parts add up to their totals, or
  (b) with exit 2 and exactly one stderr line 'planner: error: ...', without a traceback,
and never with another exit code, an exception out of main(), a traceback or a hang.

This module is also the generator of benchmarks/fuzz.py (10,000+ inputs), so everything above the
tests imports without pytest.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from planner import cli
from planner.bounds import BOUNDS
from planner.data import MAX_FILE_BYTES

try:
    import pytest
except ModuleNotFoundError:  # benchmarks/fuzz.py reuses the generator without pytest
    pytest = None

# Wall-clock limits per call, which benchmarks/fuzz.py checks (CHECK_WALL_CLOCK) and the tests do not:
# a busy CI machine is no measure of speed. recommend must answer or refuse within 2 s, with a 2x margin
# (a typical call takes 0.05-0.4 s). A call still running after HANG_S (validate, which answers the
# whole published-run corpus and refits its coefficients, VALIDATE_HANG_S) is cut off (SIGALRM) and
# reported with the stack it was cut off in.
CHECK_WALL_CLOCK = False
RECOMMEND_LIMIT_S = 4.0
CALL_LIMIT_S = 5.0
HANG_S = 10.0
VALIDATE_HANG_S = 300.0
MEMORY_LIMIT = 2 * 2**30
"""Address space a call may add (Linux; the largest searches take < 0.2 GiB): past it allocations raise
MemoryError instead of waking the OOM killer."""

# ---------------------------------------------------------------------------------------------
# the flag surface, read from the parser (frozen by tests/test_cli.py)


def _surface() -> dict:
    """{command: {flag: takes_value}} for every long option but --help."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: {s: a.nargs != 0 for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
            for name, p in sub.choices.items()}


SURFACE = _surface()

# ---------------------------------------------------------------------------------------------
# values

MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mistral-7b",
          "mixtral-8x7b", "gpt3-175b", "megatron-gpt-1.7b", "korthikanti-gpt-1t", "LLAMA-2-7B"]
GPUS = ["a100-80gb", "a100-40gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "mi300x", "h100", "A100"]
WORDS = {
    "--precision": ["bf16", "fp16", "fp32", "bf16-pure", "fp8", "BF16"],
    "--optimizer": ["adamw", "sgd", "adafactor", "adam8bit", "lion"],
    "--engine": ["deepspeed", "megatron-deepspeed", "megatron", "fsdp", "torchtitan", "DeepSpeed", "horovod"],
    "--schedule": ["1f1b", "interleaved", "gpipe", "zb"],
    "--offload-optimizer": ["none", "cpu", "nvme", "disk"],
    "--offload-params": ["none", "cpu", "nvme", "disk"],
    "--recompute": ["none", "selective", "full", "sometimes"],
    "--rank-order": ["tp-cp-dp-pp", "tp-cp-pp-dp", "pp-dp-tp"],
    "--ffn-kind": ["gelu", "swiglu", "relu"],
    "--zero": ["0", "1", "2", "3", "4"],
    "--gpu": GPUS + ["h1000", "tpu-v5"],
    "--model": MODELS + ["lama-2-7b", "gpt-5", "config.json", "/no/such/config.json", "nul\x00.json", "/dev/null"],
    # a profile: none, an unknown name, a missing path, a non-JSON file, a foreign schema, one of other hardware
    "--calibration": ["none", "nope", "/no/such/profile.json", "/dev/null", "data/coefficients.json", "cpu-gloo"],
}
SENSIBLE = {
    "gpus": [1, 2, 4, 8, 16, 32, 64, 128, 512, 4096], "gpus_per_node": [1, 2, 4, 8, 16, 72],
    "layers": [1, 2, 4, 8, 32, 80], "hidden": [64, 256, 1024, 4096, 8192], "heads": [1, 2, 8, 32, 64],
    "kv_heads": [1, 2, 8], "ffn": [256, 4096, 11008, 14336], "vocab": [1, 1000, 32000, 128256],
    "seq_len": [1, 128, 2048, 4096, 8192, 131072], "gbs": [1, 8, 64, 256, 1024], "mbs": [1, 2, 4, 8],
    "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "dp": [1, 2, 4, 8], "cp": [1, 2, 4], "ep": [1, 2, 8], "vpp": [1, 2, 4],
    "top": [1, 3, 5, 50], "max_mbs": [1, 4, 16, 64], "memory_headroom": ["0", "0.05", "0.5", "0.99"],
    "params": ["1e6", "125M", "1.3b", "7e9", "70B", "405e9", "1.5T"], "tokens": ["1e9", "1e12", "15T"],
    "tokens_per_step": ["1M", "4194304", "16m"], "price_per_gpu_hour": ["0.5", "2", "12.75"],
    "gpu_memory_gib": ["16", "40", "80", "141"], "peak_tflops": ["100", "989.4"], "hbm_gb_per_s": ["900", "3350"],
    "intra_node_gb_per_s": ["25", "450"], "inter_node_gb_per_s": ["12.5", "50"], "pcie_gb_per_s": ["25"],
    "host_ram_gib": ["256", "2048"], "nvme_gb_per_s": ["5", "50"], "pod_gpus": ["0", "16", "256", "3072"],
    "oversubscription": ["1", "2", "7"],
    "reduce_bucket_size": ["5e8", "500000000"], "allgather_bucket_size": ["5e8"], "sub_group_size": ["1e9"],
    "stage3_prefetch_bucket_size": ["0", "5e7"], "stage3_max_live_parameters": ["0", "1e9"],
    "stage3_max_reuse_distance": ["0", "1e9"], "stage3_param_persistence_threshold": ["0", "1e5"],
}
HOSTILE = ["1e12", "1e309", "-1e309", "1e-320", "inf", "-inf", "Infinity", "nan", "NaN", "-1", "-0", "0", "0.0", "",
           " ", "abc", "9" * 40, "9" * 5000, "0x10", "1_000", "1,000", "+1", "1e", ".", "1.", "7e9", "70B", "1.5T",
           "4M", "2**20", "None", "null", "true", "[]", "{}", "½", "٣", "𝟗", "１２", "ℵ", "é" * 3, "\u2028", "a\nb",
           "\x00", "\udcff", "\ud800", "💥" * 10, "x" * 10000, "-", "--", "-json", "../", "/"]


def _fmt(x) -> list:
    """Spellings of one number: plain, exponent, and with the count suffixes."""
    out = [repr(x) if isinstance(x, float) else str(x), f"{x:g}", f"{float(x):e}"]
    if x and x == int(x):
        out += [f"{x / 1e3:g}k", f"{x / 1e9:g}B"]
    return out


def _boundary(key: str) -> list:
    b = BOUNDS[key]
    values = [0, 1, -1, b.low, b.high, b.high + 1, b.high * (1 + 1e-9), b.high * 10, b.low - 1, b.low + 0.5]
    if not b.integer:
        values += [b.low + 1e-12, math.nextafter(b.low, -math.inf), b.high - 1e-6, math.nextafter(b.high, math.inf)]
    return sorted({s for v in values for s in _fmt(v)})


def value_for(flag: str):
    """A strategy of values for one flag: valid, boundary or hostile."""
    key = flag[2:].replace("-", "_")
    valid = []
    if flag in WORDS:
        valid = WORDS[flag]
    elif key in SENSIBLE:
        valid = [str(v) for v in SENSIBLE[key]]
    elif key in BOUNDS:
        valid = ["1", "2"]
    options = [st.sampled_from(valid)] if valid else []
    if key in BOUNDS:
        b = BOUNDS[key]
        options.append(st.sampled_from(_boundary(key)))
        if b.integer:
            options.append(st.integers(int(b.low), int(b.high)).map(str))
        else:
            options.append(st.floats(b.low, b.high, allow_nan=False, allow_infinity=False).map(repr))
    options.append(st.sampled_from(HOSTILE))
    options.append(st.text(max_size=12))
    return st.one_of(*options)


# ---------------------------------------------------------------------------------------------
# files made when an example runs: config.json files for --model and fresh --emit directories


@dataclass(frozen=True)
class ConfigFile:
    """A --model file to write: `text` (bytes) under `name`, or a directory, or the shared big file."""

    name: str = "config.json"
    text: bytes = b""
    kind: str = "file"
    """'file', 'dir' (a directory called `name`), 'fifo' (a named pipe nobody writes), 'big' (> 4 MiB) or
    'missing' (never written)."""

    def __repr__(self):
        text = self.text if len(self.text) <= 600 else self.text[:200] + b"..." + self.text[-20:]
        return f"ConfigFile({self.kind}, {self.name!r}, {text!r}, {len(self.text)} bytes)"


@dataclass(frozen=True)
class EmitDir:
    """A fresh, empty directory for --emit."""

    def __repr__(self):
        return "EmitDir()"


_RAW = "\x01raw:"  # a string value written as raw JSON text (NaN, 1e400, huge integers)


def _raw(text: str) -> str:
    return _RAW + text + "\x01"


def _dumps(obj) -> str:
    """JSON text of `obj`, with every _raw() string written as its raw text."""
    return re.sub(r'"\\u0001raw:(.*?)\\u0001"', lambda m: m.group(1), json.dumps(obj, indent=1))


BAD_FIELD = st.sampled_from([
    "4096", True, False, None, [], {}, 4096.5, -1, 0, 2**40, 10**30, 1e30, "", "nan", _raw("NaN"), _raw("Infinity"),
    _raw("-Infinity"), _raw("1e400"), _raw("-1e400"), _raw("9" * 5000), _raw("1" + "0" * 400), "\ud800", "\udcff",
])


@st.composite
def hf_config(draw) -> dict:
    """A Hugging Face config dict: valid for its family, then perhaps with fields broken or dropped."""
    kind = draw(st.sampled_from(["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "bert", "LLAMA"]))
    heads = draw(st.sampled_from([1, 4, 8, 32, 64]))
    hidden = heads * draw(st.sampled_from([16, 64, 128]))
    if kind == "gpt2":
        cfg = {"model_type": kind, "n_layer": draw(st.sampled_from([2, 12, 48])), "n_embd": hidden, "n_head": heads,
               "vocab_size": 50257, "n_positions": draw(st.sampled_from([1024, 2048]))}
        if draw(st.booleans()):
            cfg["n_inner"] = None
    else:
        cfg = {"model_type": kind, "num_hidden_layers": draw(st.sampled_from([1, 2, 16, 32, 80])),
               "hidden_size": hidden, "num_attention_heads": heads, "intermediate_size": 4 * hidden,
               "vocab_size": draw(st.sampled_from([1000, 32000, 128256]))}
        if draw(st.booleans()):
            cfg["num_key_value_heads"] = draw(st.sampled_from([None, 1, heads]))
        if kind == "mixtral":
            cfg.update(num_local_experts=draw(st.sampled_from([2, 8, 64])), num_experts_per_tok=2)
    for key in draw(st.lists(st.sampled_from(["tie_word_embeddings", "attention_bias", "mlp_bias", "head_dim",
                                              "attn_pdrop", "hidden_dropout", "_name_or_path"]), max_size=3)):
        cfg[key] = draw(st.one_of(st.booleans(), st.sampled_from([0, 0.1, 64, "name", "\ud800 name", "n" * 1000])))
    for key in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del cfg[key]
        else:
            cfg[key] = draw(BAD_FIELD)
    return cfg


@st.composite
def config_file(draw) -> ConfigFile:
    choice = draw(st.integers(0, 19))
    if choice < 10:
        return ConfigFile(text=_dumps(draw(hf_config())).encode("utf-8", "surrogatepass"))
    return draw(st.sampled_from([
        ConfigFile(text=b"[" * 5000 + b"]" * 5000),
        ConfigFile(text=b'{"a":' * 5000 + b"1" + b"}" * 5000),
        ConfigFile(text=b"[" * 100000),
        ConfigFile(text=b'{"model_type": "llama", "x": "' + b"[" * 5000 + b'"}'),
        ConfigFile(kind="big"),
        ConfigFile(text=b'{"model_type": "llama", "num_hidden_layers": NaN, "hidden_size": Infinity}'),
        ConfigFile(text=b'{"model_type": "gpt2", "n_layer": 1e400}'),
        ConfigFile(text=b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}"),
        ConfigFile(text=b"\xff\xfe\x00{not utf-8}"),
        ConfigFile(text="\ufeff{}".encode()),
        ConfigFile(text=b""),
        ConfigFile(text=b"{not json"),
        ConfigFile(text=b"[]"), ConfigFile(text=b"3"), ConfigFile(text=b'"llama"'), ConfigFile(text=b"null"),
        ConfigFile(text=b"{}"),
        ConfigFile(text=b'{"model_type": ["llama"]}'),
        ConfigFile(name="cfgdir.json", kind="dir"),
        ConfigFile(name="cfgdir", kind="dir"),
        ConfigFile(name="pipe.json", kind="fifo"),
        ConfigFile(name="absent.json", kind="missing"),
        ConfigFile(name="config.txt", text=b'{"model_type": "llama"}'),
        ConfigFile(name="weird \u00e9 name .json", text=b"{}"),
    ]))


_BIG: list = []


def _big_file() -> Path:
    """One shared file just over the 4 MiB limit (written once per process)."""
    if not _BIG:
        d = Path(tempfile.mkdtemp(prefix="planner-fuzz-big-"))
        import atexit

        atexit.register(shutil.rmtree, d, True)
        path = d / "big.json"
        path.write_bytes(b'{"model_type": "llama", "pad": "' + b"x" * MAX_FILE_BYTES + b'"}')
        _BIG.append(path)
    return _BIG[0]


def materialize(argv: list, workdir: Path) -> list[str]:
    """argv with every ConfigFile/EmitDir made real under `workdir`."""
    out = []
    for i, a in enumerate(argv):
        if isinstance(a, EmitDir):
            path = workdir / f"emit{i}"
            path.mkdir()
            out.append(str(path))
        elif isinstance(a, ConfigFile):
            if a.kind == "big":
                out.append(str(_big_file()))
                continue
            path = workdir / f"m{i}" / a.name
            path.parent.mkdir()
            if a.kind == "dir":
                path.mkdir()
            elif a.kind == "fifo":
                if not hasattr(os, "mkfifo"):
                    path.write_bytes(b"{}")
                else:
                    os.mkfifo(path)
            elif a.kind == "file":
                path.write_bytes(a.text)
            out.append(str(path))
        else:
            out.append(a)
    return out


# ---------------------------------------------------------------------------------------------
# argv strategies


def model_args():
    """How the model is named: catalog, --params, a config.json, a full shape, or nothing."""
    return st.one_of(
        st.sampled_from(MODELS).map(lambda m: ["--model", m]),
        st.sampled_from(SENSIBLE["params"]).map(lambda p: ["--params", p]),
        config_file().map(lambda c: ["--model", c]),
        st.tuples(*(st.sampled_from(SENSIBLE[k]) for k in ("layers", "heads", "vocab")), st.sampled_from([16, 64, 128]))
        .map(lambda t: ["--layers", str(t[0]), "--heads", str(t[1]), "--vocab", str(t[2]), "--hidden", str(t[1] * t[3])]),
        st.just([]),
    )


@st.composite
def extra_flags(draw, command: str, max_size: int = 3) -> list:
    """A few flags of `command` with drawn values (valid, boundary or hostile)."""
    flags = draw(st.lists(st.sampled_from(sorted(SURFACE[command])), max_size=max_size, unique=True))
    out = []
    for flag in flags:
        if flag == "--json":
            continue
        out.append(flag)
        if flag == "--emit":
            out.append(EmitDir())
        elif flag == "--model" and draw(st.booleans()):
            out.append(draw(config_file()))
        elif SURFACE[command][flag]:
            out.append(draw(value_for(flag)))
    return out


@st.composite
def estimate_argv(draw) -> list:
    """A sensible layout (often valid), perhaps disturbed by a few drawn flags."""
    argv = ["estimate", *draw(model_args())]
    deg = {k: draw(st.sampled_from(SENSIBLE[k])) for k in ("tp", "pp", "cp", "dp", "mbs")}
    gas = draw(st.sampled_from([1, 2, 8]))
    for k in ("tp", "pp", "cp", "dp", "mbs"):
        if deg[k] != 1 or draw(st.booleans()):
            argv += ["--" + k, str(deg[k])]
    if draw(st.booleans()):
        argv += ["--gpus", str(deg["tp"] * deg["pp"] * deg["cp"] * deg["dp"])]
    if draw(st.booleans()):
        argv += ["--gbs", str(deg["mbs"] * deg["dp"] * gas)]
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    argv += ["--zero", str(zero)]
    if zero and draw(st.integers(0, 3)) == 0:
        where = draw(st.sampled_from(["cpu", "nvme"]))
        argv += ["--offload-optimizer", where] + (["--offload-params", where] if zero == 3 else [])
    if draw(st.booleans()):
        argv += ["--recompute", draw(st.sampled_from(["none", "selective", "full"]))]
    if deg["tp"] > 1 and draw(st.booleans()):
        argv.append("--sequence-parallel")
    for flag in ("--engine", "--gpu", "--precision", "--optimizer"):
        if draw(st.integers(0, 3)) == 0:
            argv += [flag, draw(st.sampled_from(WORDS[flag][:5]))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--ds-estimator"]
    return argv + draw(extra_flags("estimate", max_size=2))


@st.composite
def recommend_argv(draw) -> list:
    argv = ["recommend", *draw(model_args())]
    if draw(st.integers(0, 9)):
        argv += ["--gpus", str(draw(st.sampled_from(SENSIBLE["gpus"])))]
    for flag in ("--gbs", "--top", "--max-mbs", "--memory-headroom", "--gpu", "--engine", "--seq-len"):
        if draw(st.integers(0, 3)) == 0:
            key = flag[2:].replace("-", "_")
            argv += [flag, str(draw(st.sampled_from(WORDS.get(flag, SENSIBLE.get(key, ["1"])))))]
    return argv + draw(extra_flags("recommend", max_size=2))


ODD_TOKENS = ["--gpus=8", "--tp=2", "--json=1", "--model=llama-2-7b", "--GPUS", "--gp", "--unknown", "-x", "--",
              "-", "estimate", "8", "--no-json", "--zero=3", "--params=7e9"]


@st.composite
def random_argv(draw) -> list:
    """Any flags of the surface with any drawn values, and now and then an odd token."""
    command = draw(st.sampled_from(["estimate", "recommend"]))
    argv = [command, *draw(model_args())]
    if command == "recommend" and draw(st.integers(0, 3)):
        argv += ["--gpus", draw(value_for("--gpus"))]
    argv += draw(extra_flags(command, max_size=8))
    if draw(st.integers(0, 4)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(st.sampled_from(ODD_TOKENS)))
    return argv


# large and highly composite values inside the bounds: the longest searches, the largest products
EXTREME = {
    "gpus": [1048576, 720720, 983040, 65536, 55440, 5040, 1], "gpus_per_node": [1024, 1008, 720, 72, 8, 1],
    "layers": [16384, 15120, 5040, 1], "hidden": [1048576, 65536, 55440, 1], "heads": [65536, 55440, 5040, 1],
    "kv_heads": [65536, 55440, 1], "ffn": [4194304, 1], "vocab": [16777216, 1], "seq_len": [67108864, 65520, 1],
    "gbs": [1073741824, 735134400, 720720, 1], "mbs": [1048576, 4096, 1], "max_mbs": [4096, 720, 1],
    "top": [10000, 1], "tp": [1024, 1008, 1], "pp": [16384, 5040, 1], "cp": [1048576, 8, 1], "dp": [1048576, 720, 1],
    "ep": [65536, 8, 1], "vpp": [16384, 6, 1], "params": ["1e14", "1e6"], "tokens": ["1e18", "1"],
    "tokens_per_step": ["70368744177664", "1"], "price_per_gpu_hour": ["1e6", "1e-300"],
    "gpu_memory_gib": ["65536", "0.001"], "peak_tflops": ["1e6", "0.001"], "hbm_gb_per_s": ["1e6", "0.001"],
    "intra_node_gb_per_s": ["1e6", "0.001"], "inter_node_gb_per_s": ["1e6", "0.001"], "pcie_gb_per_s": ["0.001"],
    "host_ram_gib": ["1073741824", "0.001"], "nvme_gb_per_s": ["0.001", "1e6"], "memory_headroom": ["0", "0.999999"],
    "pod_gpus": ["1048576", "8", "0"], "oversubscription": ["1024", "1"],
    "reduce_bucket_size": ["1e13", "1"], "sub_group_size": ["1e15", "1"], "stage3_max_live_parameters": ["1e15", "0"],
}


def moe_config(draw) -> ConfigFile:
    experts = draw(st.sampled_from([8, 64, 720, 55440, 65536]))
    cfg = {"model_type": "mixtral", "num_hidden_layers": draw(st.sampled_from([32, 5040])), "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
           "num_local_experts": experts, "num_experts_per_tok": draw(st.sampled_from([1, 2, experts]))}
    return ConfigFile(text=json.dumps(cfg).encode())


@st.composite
def extreme_argv(draw) -> list:
    """Valid but extreme values, several at once."""
    command = draw(st.sampled_from(["estimate", "recommend"]))
    argv = [command]
    how = draw(st.integers(0, 3))
    if how == 0:
        argv += ["--model", draw(st.sampled_from(["mixtral-8x7b", "llama-3.1-405b", "korthikanti-gpt-1t"]))]
    elif how == 1:
        argv += ["--model", moe_config(draw)]
    elif how == 2:
        argv += ["--params", draw(st.sampled_from(EXTREME["params"]))]
    keys = [k for k in EXTREME if k != "params" and "--" + k.replace("_", "-") in SURFACE[command]]
    for key in draw(st.lists(st.sampled_from(keys), min_size=2, max_size=10, unique=True)):
        argv += ["--" + key.replace("_", "-"), str(draw(st.sampled_from(EXTREME[key])))]
    if command == "recommend" and "--gpus" not in argv:
        argv += ["--gpus", str(draw(st.sampled_from(EXTREME["gpus"])))]
    return argv


@st.composite
def cases(draw) -> list:
    """One argv, its --model files and --emit directories still to be made (see `materialize`)."""
    pick = draw(st.integers(0, 99))
    if pick == 0:
        return ["validate"] + draw(st.sampled_from([["--json"], [], ["--json", "--gpus", "8"], ["--json", "--json"]]))
    argv = draw(estimate_argv() if pick < 35 else recommend_argv() if pick < 60 else extreme_argv() if pick < 70
                else random_argv())
    if draw(st.integers(0, 9)):
        argv.append("--json")
    if draw(st.integers(0, 19)) == 0:
        argv.append("--emit")
        argv.append(EmitDir())
    return argv


# ---------------------------------------------------------------------------------------------
# running one argv and checking the property


@dataclass
class Outcome:
    argv: list
    """As run (files made)."""
    spec: list = field(default_factory=list)
    """As drawn (the files' contents shown)."""
    code: object = None
    """main()'s return value (None when it raised)."""
    stdout: str = ""
    stderr: str = ""
    elapsed: float = 0.0
    error: str = ""
    """The traceback of an exception that escaped main()."""
    violations: list = field(default_factory=list)
    """[(kind, detail)]."""


KINDS = ("bad exit code", "exception/traceback", "bad stderr", "bad json", "non-finite or negative number",
         "parts not summing", "too slow", "warning")


class _Hang(BaseException):
    pass


@contextlib.contextmanager
def _memory_cap(extra: int):
    """Cap the address space at its current size plus `extra` bytes (Linux; restored afterwards)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        old = resource.getrlimit(resource.RLIMIT_AS)
        cap = used + extra if old[0] == resource.RLIM_INFINITY else min(old[0], used + extra)
        if old[1] != resource.RLIM_INFINITY:
            cap = min(cap, old[1])
        resource.setrlimit(resource.RLIMIT_AS, (cap, old[1]))
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


@contextlib.contextmanager
def _alarm(seconds: float):
    """Cut off a call after `seconds` (main thread on POSIX only)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise _Hang(f"no answer after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(spec: list) -> Outcome:
    """Make the case's files, run main() on it in process, and check the property."""
    with tempfile.TemporaryDirectory(prefix="planner-fuzz-") as tmp:
        argv = materialize(spec, Path(tmp))
        o = Outcome(argv=argv, spec=list(spec))
        raw = io.BytesIO()
        # like a real UTF-8 stdout: text that cannot be encoded raises instead of being kept
        out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n")
        err = io.StringIO()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            try:
                hang = VALIDATE_HANG_S if argv and argv[0] == "validate" else HANG_S
                with contextlib.redirect_stderr(err), _memory_cap(MEMORY_LIMIT), _alarm(hang):
                    o.code = cli.main(list(argv), out=out)
            except KeyboardInterrupt:
                raise
            except BaseException:  # noqa: BLE001 - anything escaping main() is what this test hunts
                o.error = traceback.format_exc()
            o.elapsed = time.perf_counter() - start
        try:
            out.flush()
            o.stdout = raw.getvalue().decode("utf-8")
        except (ValueError, UnicodeError) as exc:
            o.violations.append(("exception/traceback", f"stdout: {exc}"))
        o.stderr = err.getvalue()
        o.violations += check(o, caught)
    return o


def check(o: Outcome, caught=()) -> list:
    """[(kind, detail)] of every way `o` breaks the property."""
    bad = []
    command = o.argv[0] if o.argv else ""
    if o.error:
        bad.append(("exception/traceback", o.error.strip().splitlines()[-1][:300]))
    elif type(o.code) is not int or o.code not in (0, 2):
        bad.append(("bad exit code", repr(o.code)))
    if "Traceback" in o.stderr or "Traceback" in o.stdout:
        bad.append(("exception/traceback", "a traceback was printed"))
    if o.code == 2:
        lines = o.stderr.splitlines()
        if len(lines) != 1 or not o.stderr.endswith("\n") or not lines[0].startswith("planner: error: "):
            bad.append(("bad stderr", f"exit 2 wants one 'planner: error: ' line, got {o.stderr[:300]!r}"))
    elif o.code == 0 and o.stderr:
        bad.append(("bad stderr", f"exit 0 with stderr {o.stderr[:300]!r}"))
    for w in caught:
        bad.append(("warning", f"{w.category.__name__}: {str(w.message)[:200]} ({Path(w.filename).name}:{w.lineno})"))
    limit = RECOMMEND_LIMIT_S if command == "recommend" else CALL_LIMIT_S
    if CHECK_WALL_CLOCK and o.elapsed > limit:
        bad.append(("too slow", f"{o.elapsed:.2f} s > {limit} s"))
    if o.code in (0, 2) and not o.error and "--json" in o.argv and (o.code == 0 or o.stdout.strip()):
        try:
            answer = json.loads(o.stdout)
        except ValueError as exc:
            bad.append(("bad json", str(exc)[:200]))
        else:
            bad += check_answer(command, answer)
    elif o.code == 0 and not o.stdout.strip():
        bad.append(("bad json", "exit 0 with nothing on stdout"))
    return bad


# Numbers that are signed by definition and so exempt from the non-negative check:
# memory.headroom_bytes and fit_margin_bytes (and any per-stage headroom_bytes) are capacity minus need, negative when the
# layout does not fit; validate's cases[].error is (predicted - published) / published, negative when
# the planner under-predicts.
SIGNED_KEYS = {"headroom_bytes", "fit_margin_bytes"}
SIGNED_KEYS_VALIDATE = {"error", "mean_error",  # predicted / published - 1, and its mean per group
                        "bloom_rank_rho"}  # the corpus's rank correlation, in [-1, 1]


def _numbers(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield path, tree


def check_answer(command: str, answer) -> list:
    bad = []
    signed = SIGNED_KEYS | (SIGNED_KEYS_VALIDATE if command == "validate" else set())
    for path, x in _numbers(answer):
        key = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if not math.isfinite(x) or (x < 0 and key not in signed):
            bad.append(("non-finite or negative number", f"{path} = {x!r}"))
    if not isinstance(answer, dict):
        return bad + [("bad json", f"answer is a {type(answer).__name__}")]
    records = {"estimate": [answer], "recommend": answer.get("layouts", [])}.get(command, [])
    for n, rec in enumerate(records):
        where = "" if command == "estimate" else f"layouts[{n}]."
        try:
            mem, tim = rec["memory"], rec["time"]
            parts = [(f"{where}memory", mem)] + [(f"{where}memory.per_stage[{s['stage']}]", s)
                                                 for s in mem.get("per_stage", [])]
            for name, m in parts:
                if sum(m["breakdown"].values()) != m["gpu_bytes"]:
                    bad.append(("parts not summing", f"{name}: breakdown sums to {sum(m['breakdown'].values())} "
                                                     f"!= gpu_bytes {m['gpu_bytes']}"))
            total = math.fsum(tim["breakdown"].values())
            if not math.isclose(total, tim["step_s"], rel_tol=1e-9):
                bad.append(("parts not summing", f"{where}time: breakdown sums to {total!r} != step_s {tim['step_s']!r}"))
        except (KeyError, TypeError, AttributeError) as exc:
            bad.append(("bad json", f"{where}: missing or malformed {exc!r}"))
    return bad


def where(o: Outcome) -> str:
    """The innermost planner frame of an escaped exception, and its type: 'planner/search.py:73 MemoryError'."""
    frames = [line.split('"')[1].rsplit("planner/", 1)[-1] + ":" + line.split("line ")[1].split(",")[0]
              for line in o.error.splitlines() if line.strip().startswith("File ") and "/planner/" in line]
    last = o.error.strip().splitlines()[-1].split(":")[0].rsplit(".", 1)[-1] if o.error else ""
    return f"planner/{frames[-1]} {last}" if frames else last


def describe(o: Outcome) -> str:
    lines = [f"argv: {o.argv!r}"] + ([f"drawn: {o.spec!r}"] if o.spec != o.argv else []) + [
             f"exit: {o.code!r} in {o.elapsed:.2f} s", f"stderr: {o.stderr[:500]!r}"]
    lines += [f"  {kind}: {detail}" for kind, detail in o.violations]
    if o.error:
        lines.append(o.error)
    return "\n".join(lines)


# no shrinking: one failing call can take HANG_S, and the drawn argv is short enough to read as it is
FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None, print_blob=False,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                       HealthCheck.large_base_example])


# ---------------------------------------------------------------------------------------------
# tests (pytest)


@FAST
@given(cases())
def test_every_input_answers_or_refuses_in_one_line(spec):
    o = run_case(spec)
    assert not o.violations, describe(o)


def _parametrize(names, values):
    return pytest.mark.parametrize(names, values) if pytest else (lambda f: f)


_NESTED = ConfigFile(text=b'{"model_type": "llama", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}")
_FIFO = ConfigFile(name="pipe.json", kind="fifo")
_SURROGATE_NAME = ConfigFile(text=_dumps({
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
    "intermediate_size": 1024, "vocab_size": 1000, "_name_or_path": "\ud800 name"}).encode())


REGRESSIONS = [
    (["estimate", "--model", "llama-2-7b", "--gpus", "1e12", "--json"], "--gpus"),
    (["recommend", "--model", "llama-2-7b", "--gpus", "1e12", "--json"], "--gpus"),
    (["recommend", "--params", "70e9", "--gpus", "1e12"], "--gpus"),
    (["estimate", "--params", "1e309", "--json"], "--params"),
    (["recommend", "--params", "7e9", "--gpus", "8", "--tokens", "1e309", "--json"], "--tokens"),
    (["estimate", "--model", "llama-2-7b", "--gpu-memory-gib", "1e309", "--json"], "--gpu-memory-gib"),
    (["estimate", "--model", "llama-2-7b", "--seq-len", "1e309"], "--seq-len"),
    (["estimate", "--model", "llama-2-7b", "--peak-tflops", "inf", "--json"], "--peak-tflops"),
    (["recommend", "--params", "7e9", "--gpus", "8", "--memory-headroom", "inf", "--json"], "--memory-headroom"),
    (["recommend", "--params", "7e9", "--gpus", "8", "--memory-headroom", "nan"], "--memory-headroom"),
    (["estimate", "--params", "inf"], "--params"),
    (["estimate", "--model", "llama-2-7b", "--tp", "9" * 40], "--tp"),
    (["estimate", "--model", _NESTED, "--json"], "--model"),
    (["recommend", "--model", _NESTED, "--gpus", "8", "--json"], "--model"),
    # found by this fuzz test
    (["estimate", "--model", _FIFO, "--json"], "--model"),
    (["estimate", "--model", "nul\x00.json", "--json"], "--model"),
    (["estimate", "--params", "7e9", "--emit", "nul\x00dir"], "--emit"),
    (["estimate", "--model", "llama-2-7b", "--peak-tflops", "1e-300", "--json"], "--peak-tflops"),
    (["estimate", "--model", "llama-2-7b", "--gpu-memory-gib", "1e-10", "--json"], "--gpu-memory-gib"),
    (["recommend", "--params", "1e12", "--gpus", "8", "--engine", "megatron", "--json"], "--gpus"),
]


@_parametrize("argv, flag", REGRESSIONS)
def test_regressions_exit_2_naming_the_flag(argv, flag):
    o = run_case(argv)
    assert o.code == 2 and not o.violations, describe(o)
    assert flag in o.stderr, o.stderr


@_parametrize("argv", [
    ["estimate", "--model", _SURROGATE_NAME],
    ["estimate", "--model", _SURROGATE_NAME, "--emit", EmitDir()],
    ["recommend", "--model", _SURROGATE_NAME, "--gpus", "8"],
])
def test_config_name_with_a_lone_surrogate_prints(argv):
    o = run_case(argv)
    assert o.code == 0 and not o.violations, describe(o)


def test_surface_is_the_frozen_one():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_frozen_cli", Path(__file__).with_name("test_cli.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {c: sorted(f) for c, f in SURFACE.items()} == module.FROZEN

