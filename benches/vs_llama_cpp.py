"""inferno vs llama.cpp on the same random weights, at the SmolLM2-135M and Qwen2.5-0.5B shapes, and at
GPT-2's 124M and XL (1.5B) shapes (--shapes gpt2-124m,gpt2-xl).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/vs_llama_cpp.py \\
        --llama-cpp /tmp/lcpp/build/bin --llama-cpp-src /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        [--work /tmp/vs_llama_cpp] [--shapes smollm2-135m,qwen2.5-0.5b] [--repeat 3] [--threads 2] \\
        [--inferno half:dtype=int8,half] [--gguf q8_0,q4_0,f16] [--no-batched] \\
        [--batched-prompt 64] [--batched-new 64] [--long 512]

PYTHONPATH must give the converter `sentencepiece` (`pip install --target DIR sentencepiece`): only the
first run converts (the folders, GGUFs and quantized GGUFs stay under --work).

What it measures, side by side in one run, rounds interleaved (llama.cpp format 1, 2, ..., inferno backend
1, 2, ..., then the next round), medians over `--repeat` rounds, both sides on `--threads` threads:

* **decode tok/s, batch 1**: llama-bench's tg64 at depth 64 (64 tokens generated after 64 in the KV
  cache) against inferno's 64 cached decode steps (one token in, host logits out, greedy) after a
  64-token prompt (`inferno.bench.time_decode`).
* **prefill tok/s** of 64 and 512 tokens (--long: another length than 512): llama-bench's pp64 and
  pp512 (the same call, ``-p 64,512 -n 64 -d 64 -r 1 --no-warmup``, so after 64 tokens of depth; one
  warm-up call per GGUF before the rounds) against one `Llama.forward` of the prompt into a fresh cache
  up to the last position's host logits (`inferno.bench.time_prefill`).
* **16 sequences, aggregate decode tok/s** (and as many more as --sequences lists: ``16,32``):
  llama-batched-bench ``-npp P -ntg N -npl 16`` (its S_TG) against inferno's `Engine` with 16 sequences
  of P-token prompts (all prefilled in one step, untimed) decoding N tokens each: decoded tokens over the
  time of the decode steps (P, N: --batched-prompt, --batched-new). The engine's KV slots hold P + N
  positions each (llama.cpp's cache is sized to the batch too).
* **the bandwidth floor** of inferno's batch-1 decode: the bytes a step reads (every weight as the backend
  holds it, the tied embedding once as the LM head, plus the KV cache up to the mean position) over the
  read bandwidth (NumPy's max over a 1 GiB buffer on `--threads` threads, best of 3, probed right before
  and right after each decode run); the measured step time over that floor.

The weights: `inferno.testing.llama_state_dict` (seeded, float32) at the real shape, stored as float16
safetensors in a Hugging Face folder (config.json as transformers writes it, max_position_embeddings
capped at 2048 so that 16 KV slots fit in memory, tokenizer files), converted with llama.cpp's
convert_hf_to_gguf.py to an f16 GGUF (the same values) and llama-quantize'd to q8_0 and q4_0; inferno
loads the folder and quantizes at load (half:dtype=int8: one scale per output row). SmolLM2's tokenizer
is GPT-2's cut to 49,152 tokens (GPT-2-style byte-level BPE, as SmolLM2's), Qwen2.5's is Qwen3's
(the copy under tests/data/tokenizers/qwen3, the same regex); speed does not depend on the tokens. The
GPT-2 shapes: `inferno.testing.random_weights` (what `inferno bench` runs) under the Hub's names, GPT-2's
config.json and tokenizer.json as shipped, n_positions raised to 2048 (the random position table's rows
only: the prompts of 1000 tokens after 64 of depth fit).

Building llama.cpp (the vendored tree of llama-cpp-python 0.3.36; its AMX path crashes here, and
GGML_NATIVE's -march=native turns AMX on whatever GGML_AMX_* say, hence the -mno-amx-* flags):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S . -B /tmp/lcpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_AMX_INT8=OFF \\
        -DGGML_AMX_BF16=OFF -DGGML_AMX_TILE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \\
        "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \\
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake --build /tmp/lcpp/build -j2 --target llama-bench llama-batched-bench llama-quantize llama-server
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from inferno.bench import counts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import wait_ready  # noqa: E402

PROMPT, NEW, LONG, SEQS = 64, 64, 512, 16
PAUSE = 0.3  # seconds of rest before each timed run (worker threads stop spinning)
CONTEXT = 2048

SHAPES = {
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "head_dim": 64, "initializer_range": 0.041666666666666664,
        "pretraining_tp": 1, "rope_scaling": None, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": "float16", "use_cache": True},
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": CONTEXT,
        "max_window_layers": 24, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": CONTEXT,
        "use_sliding_window": False, "tie_word_embeddings": True, "hidden_act": "silu",
        "initializer_range": 0.02, "attention_dropout": 0.0, "rope_scaling": None,
        "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "float16", "use_cache": True},
}
#: GPT-2's shapes (config.json as shipped, with these sizes).
GPT2_SHAPES = {"gpt2-124m": {"n_embd": 768, "n_layer": 12, "n_head": 12},
               "gpt2-xl": {"n_embd": 1600, "n_layer": 48, "n_head": 25}}
#: Prompt ids over HTTP are drawn below this: the ordinary tokens (the servers refuse ids that their
#: tokenizer does not have, as Qwen's padding past its added tokens).
PROMPT_VOCAB = {"smollm2-135m": 49151, "qwen2.5-0.5b": 151643, "gpt2-124m": 50256, "gpt2-xl": 50256}
#: tokenizer.ggml.pre to write when the converter does not recognise the synthetic tokenizer's hash.
PRE = {"smollm2-135m": "smollm", "qwen2.5-0.5b": "qwen2", "gpt2-124m": "gpt-2", "gpt2-xl": "gpt-2"}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


# ----------------------------------------------------------------------------------------- the folders


def gpt2_tokenizer_cut(n_vocab: int, source: Path) -> dict:
    """GPT-2's tokenizer.json with its first n_vocab - 1 tokens (merge k makes token 256 + k) and
    <|endoftext|> as the last id."""
    t = json.loads(source.read_text())
    keep = n_vocab - 1
    vocab = {s: i for s, i in t["model"]["vocab"].items() if i < keep}
    merges = t["model"]["merges"][: keep - 256]
    t["model"].update(type="BPE", vocab=vocab, merges=merges)
    eot = dict(t["added_tokens"][0], id=keep)
    t["model"]["vocab"][eot["content"]] = keep
    t["added_tokens"] = [eot]
    return t


def make_gpt2_folder(shape: str, folder: Path, seed: int) -> None:
    from inferno.models.config import Gpt2Config
    from inferno.models.resolve import shipped_gpt2_file
    from inferno.testing import random_weights, save_tensors

    config = json.loads(Path(shipped_gpt2_file("config.json")).read_text())
    config.update(GPT2_SHAPES[shape], n_positions=CONTEXT, n_ctx=CONTEXT)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(shipped_gpt2_file("tokenizer.json"), folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2TokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "add_prefix_space": False, "model_max_length": CONTEXT}))
    shape_config = Gpt2Config(vocab_size=config["vocab_size"], n_positions=CONTEXT, **GPT2_SHAPES[shape])
    save_tensors(folder / "model.safetensors.tmp", random_weights(shape_config, seed), "F16")
    os.replace(folder / "model.safetensors.tmp", folder / "model.safetensors")


def make_folder(shape: str, work: Path, seed: int = 0) -> Path:
    """The Hugging Face folder of `shape` (written once)."""
    from inferno.testing import llama_state_dict, save_tensors

    folder = work / shape / "hf"
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if shape in GPT2_SHAPES:
        make_gpt2_folder(shape, folder, seed)
        return folder
    config = dict(SHAPES[shape], transformers_version="4.46.0")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if shape == "smollm2-135m":
        from inferno.models.resolve import shipped_gpt2_file

        tok = gpt2_tokenizer_cut(config["vocab_size"], Path(shipped_gpt2_file("tokenizer.json")))
        (folder / "tokenizer.json").write_text(json.dumps(tok))
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "add_prefix_space": False, "model_max_length": CONTEXT}))
    else:
        import gzip

        qwen3 = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizers" / "qwen3"
        (folder / "tokenizer.json").write_bytes(gzip.decompress((qwen3 / "tokenizer.json.gz").read_bytes()))
        shutil.copy(qwen3 / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))
    sd = llama_state_dict(config, seed)
    save_tensors(folder / "model.safetensors.tmp", sd, "F16")
    os.replace(folder / "model.safetensors.tmp", folder / "model.safetensors")
    return folder


CONVERT = """
import runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
original = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:  # a synthetic tokenizer: say which pre-tokenizer it uses
        return sys.argv[2]
base.TextModel.get_vocab_base_pre = pre
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_ggufs(shape: str, folder: Path, src: Path, bins: Path, formats: list[str]) -> dict[str, Path]:
    out = {}
    f16 = folder.parent / f"{shape}-f16.gguf"
    if not f16.exists():
        run([sys.executable, "-c", CONVERT, str(src), PRE[shape], str(folder), "--outtype", "f16",
             "--outfile", str(f16)])
    for fmt in formats:
        path = folder.parent / f"{shape}-{fmt}.gguf"
        if not path.exists():
            run([str(bins / "llama-quantize"), str(f16), str(path), fmt.upper()])
        out[fmt] = path
    return out


# ----------------------------------------------------------------------------------------- llama.cpp


def llama_bench(bins: Path, gguf: Path, threads: int, long: int = LONG) -> dict[str, float]:
    """tok/s of pp64 and pp`long` and tg64, all at depth 64 (64 tokens already in the KV cache), one
    repetition each, in one llama-bench call (no warm-up run: `llama_warm_up` ran once before)."""
    time.sleep(PAUSE)
    r = run([str(bins / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-r", "1", "--no-warmup",
             "-o", "json", "-p", f"{PROMPT},{long}", "-n", str(NEW), "-d", str(PROMPT)])
    got = {}
    for test in json.loads(r.stdout):
        key = "decode" if test["n_gen"] else f"prefill{test['n_prompt']}"
        got[key] = test["avg_ts"]
    return got


def llama_warm_up(bins: Path, gguf: Path, threads: int) -> None:
    run([str(bins / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-r", "1", "-p", "8", "-n", "4"])


def llama_batched(bins: Path, gguf: Path, threads: int, prompt: int, new: int, seqs: int = SEQS) -> float:
    """S_TG (aggregate decode tok/s) of `seqs` sequences of `prompt`-token prompts, `new` new tokens each."""
    time.sleep(PAUSE)
    r = run([str(bins / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads),
             "-c", str(max(CONTEXT, seqs * (prompt + new))),
             "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(new), "-npl", str(seqs),
             "--output-format", "jsonl"])
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return float(json.loads(line)["speed_tg"])
    raise RuntimeError(f"no jsonl line in llama-batched-bench's output:\n{r.stdout[-2000:]}")


# ------------------------------------------------------------------------------------------- inferno


def load_inferno(folder: Path, spec: str, threads: int):
    from inferno.backends.registry import get_backend, parse_backend_spec
    from inferno.models.families import load_model

    name, options = parse_backend_spec(spec)
    options.setdefault("threads", threads)
    return load_model(folder / "config.json", folder, get_backend(name, **options))


def inferno_batch1(model, long: int = LONG) -> dict[str, float]:
    from inferno.bench import prompt_ids, time_prefill

    vocab = model.config.vocab_size
    got = {}
    time.sleep(PAUSE)
    got["prefill64"] = PROMPT / time_prefill(model, prompt_ids(PROMPT, vocab, seed=1))
    time.sleep(PAUSE)
    got[f"prefill{long}"] = long / time_prefill(model, prompt_ids(long, vocab, seed=2))
    return got


def inferno_decode(model) -> float:
    from inferno.bench import prompt_ids, time_decode

    time.sleep(PAUSE)
    return 1 / time_decode(model, prompt_ids(PROMPT, model.config.vocab_size, seed=3), NEW)


def inferno_batched(model, prompt: int, new: int, seqs: int = SEQS) -> float:
    """Aggregate decode tok/s of `seqs` sequences of `prompt`-token prompts through the engine, `new` new
    tokens each (the prefill step, which also picks each first token, untimed)."""
    from dataclasses import replace

    from inferno.bench import prompt_ids
    from inferno.engine import Engine
    from inferno.kv import new_slots

    # Slots of prompt + new positions, not the whole context: llama-batched-bench's cache holds
    # max(CONTEXT, seqs * (prompt + new)) cells for all its sequences.
    short = replace(model.config, n_positions=prompt + new)
    model.new_slots = lambda n: new_slots(model.kernels, short, n)
    try:
        engine = Engine(model, slots=seqs, prefill_chunk=prompt * seqs, autostart=False)
    finally:
        del model.new_slots
    vocab = model.config.vocab_size
    handles = [engine.submit(prompt_ids(prompt, vocab, seed=100 + i), new) for i in range(seqs)]
    engine.step()
    assert all(len(h.state.ids) == 1 for h in handles)
    time.sleep(PAUSE)
    start = time.perf_counter()
    while engine.step():
        pass
    seconds = time.perf_counter() - start
    engine.close()
    assert all(len(h.state.ids) == new for h in handles)
    return seqs * (new - 1) / seconds



def bytes_per_step(model) -> int:
    """Bytes of weights a batch-1 decode step reads (each weight as held, the tied embedding once: as the
    LM head; the embedding row is noise), plus the float32 KV cache up to the mean position."""
    weights = sum(int(getattr(a, "weight", a).nbytes)  # (inferno-gpt2-torch's LinearWeight wraps a tensor)
                  for _, a in model.named_weights())
    c = model.config
    mean_position = PROMPT + NEW / 2
    kv = 2 * c.n_layer * c.n_kv_head * (c.n_embd // c.n_head) * 4 * mean_position
    return weights + int(kv)


# ------------------------------------------------------------------------------------------- serving


def start_servers(folder: Path, gguf: Path, spec: str, threads: int, work: Path, prompt: int, new: int,
                  ports: tuple[int, int] = (8391, 8392)) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """llama-server (16 parallel slots, continuous batching) and `inferno serve` (16 slots), both idle
    until asked; returns the processes and {side: url}."""
    bins = Path(START["bins"])
    procs = [subprocess.Popen([str(bins / "llama-server"), "-m", str(gguf), "-t", str(threads), "-tb",
                               str(threads), "-np", str(SEQS), "-c", str(SEQS * (prompt + new + 64)),
                               "--host", "127.0.0.1", "--port", str(ports[0])],
                              stdout=open(work / "llama-server.log", "wb"), stderr=subprocess.STDOUT),
             subprocess.Popen([sys.executable, "-m", "inferno", "serve", "--model-dir", str(folder),
                               "--backend", f"{spec},threads={threads}", "--port", str(ports[1]),
                               "--slots", str(SEQS), "--served-model-name", "m"],
                              stdout=open(work / "inferno-serve.log", "wb"), stderr=subprocess.STDOUT)]
    urls = {"llama-server": f"http://127.0.0.1:{ports[0]}", "inferno serve": f"http://127.0.0.1:{ports[1]}"}
    try:
        for url, proc in zip(urls.values(), procs, strict=True):
            wait_ready(url, proc, timeout=300)  # (its logs are under `work`)
    except BaseException:
        for proc in procs:
            proc.terminate()
        raise
    return procs, urls


def clients16(url: str, vocab: int, prompt: int, new: int, seed: int) -> float:
    """16 concurrent non-streaming /v1/completions requests (random prompt ids, `new` tokens each,
    ignore_eos, greedy): completion tokens over the wall time of all."""
    import httpx

    from inferno.bench import prompt_ids

    def one(k: int) -> int:
        body = {"model": "m", "prompt": prompt_ids(prompt, vocab, seed=seed * 100 + k), "max_tokens": new,
                "temperature": 0.0, "ignore_eos": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=3600)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    time.sleep(PAUSE)
    start = time.perf_counter()
    with ThreadPoolExecutor(SEQS) as pool:
        tokens = sum(pool.map(one, range(SEQS)))
    seconds = time.perf_counter() - start
    assert tokens == SEQS * new, tokens
    return tokens / seconds


START: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------- main


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="the folder of llama.cpp's binaries")
    ap.add_argument("--llama-cpp-src", type=Path, required=True, help="llama.cpp's source tree "
                    "(convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vs_llama_cpp"))
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join([*SHAPES, *GPT2_SHAPES])}")
    ap.add_argument("--inferno", default="half:dtype=int8,half", help="backend specs, ';'-separated "
                    "when a spec has several options")
    ap.add_argument("--gguf", default="q8_0,q4_0,f16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-batched", action="store_true", help="skip the batched cases")
    ap.add_argument("--sequences", type=counts, default=[SEQS],
                    help="the batched case's numbers of sequences, comma-separated (16; 16,32 for both)")
    ap.add_argument("--batched-prompt", type=int, default=PROMPT, help="batched: prompt tokens each")
    ap.add_argument("--batched-new", type=int, default=NEW, help="batched: new tokens each")
    ap.add_argument("--long", type=int, default=LONG, help="the long prefill's tokens (default 512)")
    ap.add_argument("--serve", metavar="GGUF", help="instead: 16 HTTP clients, llama-server on this GGUF "
                    "format vs `inferno serve` on the first --inferno spec (--batched-prompt/-new tokens)")
    args = ap.parse_args(argv)
    sep = ";" if ";" in args.inferno else ","
    specs = [s for s in args.inferno.split(sep) if s]
    if sep == "," and any("=" in s and ":" not in s for s in specs):
        ap.error("give several options of one spec with ';' between specs")
    formats = args.gguf.split(",")
    given = argv if argv is not None else sys.argv[1:]
    print(f"`{' '.join(['python', 'benches/vs_llama_cpp.py', *given])}`")
    print(f"load average at start: {os.getloadavg()}")
    START["bins"] = str(args.llama_cpp)
    if args.serve:
        return serve_main(args, specs[0])
    from inferno.bench import read_bandwidth

    buffer = np.ones(2**30 // 4, dtype=np.float32)
    pool = ThreadPoolExecutor(args.threads)
    for shape in args.shapes.split(","):
        folder = make_folder(shape, args.work)
        ggufs = make_ggufs(shape, folder, args.llama_cpp_src, args.llama_cpp, formats)
        models = {s: load_inferno(folder, s, args.threads) for s in specs}
        for f in formats:
            llama_warm_up(args.llama_cpp, ggufs[f], args.threads)
        for m in models.values():  # warm-up: first calls, thread pools, AMX/oneDNN set-up
            inferno_batch1(m)
            inferno_decode(m)
        sides = [f"llama.cpp {f}" for f in formats] + [f"inferno {s}" for s in specs]
        res: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
        floor_ratio: dict[str, list[float]] = {s: [] for s in specs}
        bw: list[float] = []
        for r in range(args.repeat):
            print(f"{shape}: round {r + 1}/{args.repeat}, load {os.getloadavg()}", file=sys.stderr)
            for f in formats:
                got = llama_bench(args.llama_cpp, ggufs[f], args.threads, args.long)
                for n in [] if args.no_batched else args.sequences:
                    got[f"batched{n}"] = llama_batched(args.llama_cpp, ggufs[f], args.threads,
                                                       args.batched_prompt, args.batched_new, n)
                for k, v in got.items():
                    res[f"llama.cpp {f}"].setdefault(k, []).append(v)
            for s, m in models.items():
                got = inferno_batch1(m, args.long)
                before = read_bandwidth(buffer, pool, args.threads)
                got["decode"] = inferno_decode(m)
                after = read_bandwidth(buffer, pool, args.threads)
                bw += [before, after]
                floor_s = bytes_per_step(m) / ((before + after) / 2)
                floor_ratio[s].append((1 / got["decode"]) / floor_s)
                for n in [] if args.no_batched else args.sequences:
                    got[f"batched{n}"] = inferno_batched(m, args.batched_prompt, args.batched_new, n)
                for k, v in got.items():
                    res[f"inferno {s}"].setdefault(k, []).append(v)
        print(f"\n{shape} (random weights, {args.threads} threads, medians of {args.repeat} interleaved "
              f"rounds; load average now {os.getloadavg()})\n")
        batched = [] if args.no_batched else [f"batched{n}" for n in args.sequences]
        keys = ["decode", "prefill64", f"prefill{args.long}", *batched]
        names = {"decode": "decode b=1 tok/s", "prefill64": "prefill 64 tok/s",
                 f"prefill{args.long}": f"prefill {args.long} tok/s",
                 **{f"batched{n}": f"{n} seqs decode tok/s" for n in args.sequences}}
        print("| side | " + " | ".join(names[k] for k in keys) + " |")
        print("| --- |" + " --: |" * len(keys))
        for s in sides:
            print(f"| {s} | " + " | ".join(f"{med(res[s][k]):.1f}" for k in keys) + " |")
        for s in specs:
            ours = res[f"inferno {s}"]
            print(f"\ninferno {s} over llama.cpp (median of per-round ratios, range):\n")
            print("| llama.cpp | " + " | ".join(names[k] for k in keys) + " |")
            print("| --- |" + " --: |" * len(keys))
            for f in formats:
                theirs = res[f"llama.cpp {f}"]
                cells = []
                for k in keys:
                    ratios = [a / b for a, b in zip(ours[k], theirs[k], strict=True)]
                    cells.append(f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
                print(f"| {f} | " + " | ".join(cells) + " |")
        print()
        for s, m in models.items():
            b = bytes_per_step(m)
            print(f"bandwidth floor, inferno {s}: {b / 1e6:.1f} MB read per step; read bandwidth probes "
                  f"(GB/s) {' '.join(f'{x / 1e9:.1f}' for x in bw)}; floor at the median probe "
                  f"{1e3 * b / med(bw):.2f} ms/step; measured {1e3 / med(res[f'inferno {s}']['decode']):.2f} "
                  f"ms/step; step / floor (paired per round): {med(floor_ratio[s]):.2f}x "
                  f"({min(floor_ratio[s]):.2f}-{max(floor_ratio[s]):.2f})")
        for m in models.values():
            m.backend.close()
        del models
        gc.collect()
    print(f"\nload average at end: {os.getloadavg()}")
    return 0


def serve_main(args: argparse.Namespace, spec: str) -> int:
    for shape in args.shapes.split(","):
        folder = make_folder(shape, args.work)
        gguf = make_ggufs(shape, folder, args.llama_cpp_src, args.llama_cpp, [args.serve])[args.serve]
        procs, urls = start_servers(folder, gguf, spec, args.threads, args.work, args.batched_prompt,
                                    args.batched_new)
        try:
            vocab = PROMPT_VOCAB[shape]
            for url in urls.values():  # warm-up
                clients16(url, vocab, 4, 4, seed=99)
            got: dict[str, list[float]] = {side: [] for side in urls}
            for r in range(args.repeat):
                print(f"{shape}: round {r + 1}/{args.repeat}, load {os.getloadavg()}", file=sys.stderr)
                for side, url in urls.items():
                    got[side].append(clients16(url, vocab, args.batched_prompt, args.batched_new, seed=r))
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
        ratios = [a / b for a, b in zip(got["inferno serve"], got["llama-server"], strict=True)]
        print(f"\n{shape}, 16 HTTP clients ({args.batched_prompt}-token prompts, {args.batched_new} new "
              f"tokens each, {args.threads} threads; medians of {args.repeat} interleaved rounds; load "
              f"average now {os.getloadavg()}): llama-server {args.serve} {med(got['llama-server']):.1f} "
              f"tok/s, inferno serve {spec} {med(got['inferno serve']):.1f} tok/s, inferno / llama.cpp "
              f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
