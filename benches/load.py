"""How long `inferno.load` takes on a big checkpoint, against reading the file, side by side in ONE run.

    python benches/load.py                       # GPT-2 XL shape (1.5B parameters, a 6.2 GB file)
    python benches/load.py --shape large --rounds 5 --backends numpy,half
    python benches/load.py --shape qwen2.5-1.5b --backends numpy,half:dtype=bfloat16   # sharded, BF16

A random checkpoint of the chosen shape is written (tensor by tensor, so this process never holds it) to
a temporary folder with the shipped config and tokenizer, read once to warm the page cache, then each
round runs, each in a fresh process and interleaved so that a noisy neighbour slows all alike:

* ``read``: the whole file read into one new buffer of its size (``readinto``): what any loader that
  ends up holding the weights must at least do;
* ``load:<backend>``: ``inferno.load(folder, backend)``, every check included (header, shapes, offsets,
  NaN/Inf), with the process's peak RSS against the bytes of weights the model holds;
* ``base:<backend>``: the same with another copy of inferno (``--baseline DIR``), to compare versions.

The Llama-family shapes (``qwen2.5-0.5b``, ``qwen2.5-1.5b``) are written as the Hub ships those models:
BF16, in shards of at most 2 GB with a ``model.safetensors.index.json``, with the Qwen tokenizer the
project's tests carry; ``read`` then reads every shard.

Prints medians and the ratio of each load to the read. The folder is deleted at the end (``--keep`` to
keep it). Needs free disk for the file (checked first) and memory for the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {  # the Hub's GPT-2 family: (n_layer, n_embd, n_head)
    "124M": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}
VOCAB, POSITIONS = 50257, 1024
#: The Llama family's shapes (the Hub's config.json of each, trimmed to what the maths needs).
LLAMA_SHAPES = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2},
}
SHARD_BYTES = 2 << 30


def tensor_shapes(n_layer: int, c: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (VOCAB, c), "wpe.weight": (POSITIONS, c)}
    for i in range(n_layer):
        h = f"h.{i}."
        shapes.update({h + "ln_1.weight": (c,), h + "ln_1.bias": (c,),
                       h + "attn.c_attn.weight": (c, 3 * c), h + "attn.c_attn.bias": (3 * c,),
                       h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
                       h + "ln_2.weight": (c,), h + "ln_2.bias": (c,),
                       h + "mlp.c_fc.weight": (c, 4 * c), h + "mlp.c_fc.bias": (4 * c,),
                       h + "mlp.c_proj.weight": (4 * c, c), h + "mlp.c_proj.bias": (c,)})
    shapes["ln_f.weight"] = (c,)
    shapes["ln_f.bias"] = (c,)
    return shapes


def write_checkpoint(folder: Path, shape: str, seed: int = 0) -> Path:
    """config.json, tokenizer.json (the shipped one) and a random F32 model.safetensors in `folder`."""
    from inferno.models.resolve import shipped_gpt2_file

    n_layer, c, n_head = SHAPES[shape]
    shapes = tensor_shapes(n_layer, c)
    header, offset = {}, 0
    for name, s in shapes.items():
        size = 4 * math.prod(s)
        header[name] = {"dtype": "F32", "shape": list(s), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(seed)
    path = folder / "model.safetensors"
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for s in shapes.values():
            a = rng.standard_normal(s, dtype=np.float32)
            a *= 0.02
            f.write(a.tobytes())
    config = {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": POSITIONS, "n_embd": c,
              "n_layer": n_layer, "n_head": n_head}
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copyfile(shipped_gpt2_file("tokenizer.json"), folder / "tokenizer.json")
    return path


def llama_config(shape: str) -> dict:
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", **LLAMA_SHAPES[shape]}


def llama_shapes(shape: str) -> dict[str, tuple[int, ...]]:
    from inferno.models.llama import LlamaConfig, tensor_plan

    return dict(tensor_plan(LlamaConfig.from_dict(llama_config(shape))).shapes)


def write_llama_checkpoint(folder: Path, shape: str, seed: int = 0) -> list[Path]:
    """config.json, the Qwen tokenizer and random BF16 shards with their index, as the Hub has them."""
    import gzip

    shapes = llama_shapes(shape)
    shards: list[list[str]] = [[]]
    size = 0
    for name, s in shapes.items():
        n = 2 * math.prod(s)
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    rng = np.random.default_rng(seed)
    files, weight_map = [], {}
    for k, names in enumerate(shards):
        path = folder / f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name in names:
            n = 2 * math.prod(shapes[name])
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]),
                            "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = path.name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            for name in names:
                a = rng.standard_normal(shapes[name], dtype=np.float32)
                a *= 0.02
                f.write((a.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # BF16: the top halves
        files.append(path)
    total = sum(2 * math.prod(s) for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(llama_config(shape)))
    data = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizers" / "qwen3"
    (folder / "tokenizer.json").write_bytes(gzip.decompress((data / "tokenizer.json.gz").read_bytes()))
    shutil.copyfile(data / "tokenizer_config.json", folder / "tokenizer_config.json")
    return files


def peak_rss() -> int:
    """This address space's peak RSS: VmHWM starts again at exec, while ru_maxrss keeps the peak of the
    process before it (the parent that wrote the checkpoint, for a forked child)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def child(kind: str, folder: Path) -> dict:
    """One measurement, in this (fresh) process."""
    if kind == "read":
        paths = sorted(folder.glob("*.safetensors"))
        start = time.perf_counter()
        buf = np.empty(sum(p.stat().st_size for p in paths), dtype=np.uint8)
        view, done = memoryview(buf), 0
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                end = done + os.fstat(f.fileno()).st_size
                while done < end:
                    done += f.readinto(view[done:end])
        return {"seconds": time.perf_counter() - start, "held": buf.nbytes, "peak_rss": peak_rss()}
    import inferno

    backend = kind.split(":", 1)[1]
    before = peak_rss()
    start = time.perf_counter()
    pipe = inferno.load(folder, backend)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "held": held_bytes(pipe.model), "peak_rss": peak_rss(), "rss_before": before}


def held_bytes(model: object) -> int:
    """Bytes of the distinct arrays the model holds (a tied LM head counted once)."""
    seen: dict[int, int] = {}

    def walk(x: object) -> None:
        if isinstance(x, (list, tuple, type({}.values()))):
            for y in x:
                walk(y)
        elif hasattr(x, "nbytes") and hasattr(x, "shape"):
            seen[id(x)] = int(x.nbytes)
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            for y in vars(x).values():
                walk(y)

    walk({k: v for k, v in vars(model).items() if k not in ("config", "backend")}.values())
    return sum(seen.values())


def measure(kind: str, folder: Path, baseline: str | None = None) -> dict:
    """`kind` in a fresh process; ``base:<backend>`` loads with the inferno package found in `baseline`."""
    env = dict(os.environ)
    if kind.startswith("base:"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline, env.get("PYTHONPATH")]))
        kind = "load:" + kind.split(":", 1)[1]
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(folder)], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, *LLAMA_SHAPES], default="xl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="numpy")
    parser.add_argument("--dir", help="where to write the checkpoint (default: a temporary folder in /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint folder")
    parser.add_argument("--baseline", metavar="DIR", help="also load with the inferno package in DIR "
                        "(another version: `git archive HEAD~3 inferno gpt2 | tar -x -C DIR`), interleaved")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return 0

    llama = args.shape in LLAMA_SHAPES
    if llama:
        need = 2 * sum(math.prod(s) for s in llama_shapes(args.shape).values())
    else:
        n_layer, c, _ = SHAPES[args.shape]
        need = 4 * sum(math.prod(s) for s in tensor_shapes(n_layer, c).values())
    base = Path(args.dir or tempfile.gettempdir())
    free = shutil.disk_usage(base).free
    if free < need * 1.1:
        print(f"not enough disk in {base}: the file needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free",
              file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="inferno-load-bench-", dir=base))
    try:
        start = time.perf_counter()
        if llama:
            paths = write_llama_checkpoint(folder, args.shape)
        else:
            paths = [write_checkpoint(folder, args.shape)]
        print(f"wrote {len(paths)} file(s) in {folder} ({sum(p.stat().st_size for p in paths) / 1e9:.2f} GB, "
              f"{'Qwen2.5' if llama else 'GPT-2'} {args.shape} shape) in {time.perf_counter() - start:.0f} s",
              flush=True)
        kinds = ["read", *(f"load:{b}" for b in args.backends.split(","))]
        if args.baseline:
            kinds += [f"base:{b}" for b in args.backends.split(",")]
        os.sync()  # the file's dirty pages written back now, not during the rounds
        measure("read", folder)  # warms the page cache
        results: dict[str, list[dict]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds:
                results[kind].append(measure(kind, folder, args.baseline))
            print(f"round {r + 1}: " + ", ".join(f"{k} {results[k][-1]['seconds']:.2f} s" for k in kinds),
                  flush=True)
        read = statistics.median(x["seconds"] for x in results["read"])
        print(f"\nmedians of {args.rounds} rounds, each a fresh process:")
        for kind in kinds:
            runs = results[kind]
            seconds = statistics.median(x["seconds"] for x in runs)
            held = runs[0]["held"]
            rss = max(x["peak_rss"] for x in runs)
            # Each round's own ratio too: the page cache of a shared machine makes whole rounds slower.
            ratios = [x["seconds"] / r["seconds"] for x, r in zip(runs, results["read"], strict=True)]
            print(f"  {kind:14s} {seconds:6.2f} s  {seconds / read:5.2f}x read (rounds {min(ratios):.2f}-"
                  f"{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x)   peak RSS "
                  f"{rss / 1e9:5.2f} GB = {rss / held:4.2f}x the {held / 1e9:.2f} GB held")
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
