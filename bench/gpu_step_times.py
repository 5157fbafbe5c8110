"""Measure real prefill and decode step times on a GPU, to calibrate the simulator's GPU profile.

Random weights give the same compute as trained ones, so a randomly initialised Llama of the
right shape is enough. Runs on the GPU machine (PyTorch + transformers there); prints one JSON
line per measurement and writes them all to --out. Usage:

    python bench/gpu_step_times.py --shape 1b --shape 8b --out step_times.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

SHAPES = {
    # name: hidden, layers, heads, kv_heads, intermediate, vocab (Llama-3 style, GQA)
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256),
}
PREFILL = [(1, 512), (1, 2048), (1, 4096), (1, 8192), (4, 1024), (8, 2048), (16, 1024)]
DECODE = [(1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (8, 4096), (32, 4096), (64, 4096),
          (128, 2048), (256, 1024)]


def build(shape: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=16384, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(prev)
    model.eval()
    return model, cfg


def timed(fn, reps: int) -> list[float]:
    import torch

    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def measure(shape: str, reps: int) -> list[dict]:
    import torch
    from transformers import DynamicCache

    model, cfg = build(shape)
    params = sum(p.numel() for p in model.parameters())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rows = []
    with torch.inference_mode():
        for batch, length in PREFILL:
            ids = torch.randint(0, cfg.vocab_size, (batch, length), device="cuda")

            def step(model=model, ids=ids):  # bound here: run in this iteration only
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

            timed(step, 2)
            ms = timed(step, reps)
            rows.append(dict(shape=shape, phase="prefill", batch=batch, context=length, tokens=batch * length,
                             ms_median=statistics.median(ms), ms_min=min(ms), params=params))
            print(json.dumps(rows[-1]), flush=True)
        for batch, ctx in DECODE:
            cache = DynamicCache()
            for layer in range(cfg.num_hidden_layers):
                k = torch.randn(batch, cfg.num_key_value_heads, ctx, head_dim, device="cuda", dtype=torch.bfloat16)
                cache.update(k, k.clone(), layer)
            ids = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
            pos = torch.full((batch, 1), ctx, device="cuda", dtype=torch.long)

            def step(model=model, ids=ids, cache=cache, pos=pos, ctx=ctx):  # bound here: run in this iteration only
                model(input_ids=ids, past_key_values=cache, position_ids=pos, use_cache=True)
                cache.crop(ctx)  # keep the context length fixed across repetitions

            timed(step, 2)
            ms = timed(step, reps)
            rows.append(dict(shape=shape, phase="decode", batch=batch, context=ctx, tokens=batch,
                             ms_median=statistics.median(ms), ms_min=min(ms), params=params))
            print(json.dumps(rows[-1]), flush=True)
            del step, cache  # step holds the cache too: both go, so that empty_cache frees it
            torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="model shapes (repeatable)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default="step_times.json")
    a = ap.parse_args()
    import torch

    t0 = time.time()
    rows = []
    for shape in a.shape or ["1b", "8b"]:
        rows.extend(measure(shape, a.reps))
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d"), seconds=round(time.time() - t0, 1),
                engine="transformers eager (SDPA attention, no CUDA graphs), bf16, random weights")
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
