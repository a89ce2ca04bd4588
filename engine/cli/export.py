"""`sapo export --out DIR`: the trained model as a PEFT LoRA adapter and a merged GGUF (engine.export)."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from engine.paths import default_data_dir

GGUF_TYPES = ("f16", "bf16", "f32")  # engine.export.GGUF_TYPES, repeated: importing it loads torch


def register(sub: Any) -> None:
    p = sub.add_parser("export", help="write the trained model into a new folder: its LoRA adapter (PEFT) and "
                       "a merged GGUF for llama.cpp, Ollama or LM Studio, with a README")
    p.add_argument("--out", type=Path, required=True, help="a new (or empty) folder to write into")
    p.add_argument("--data-dir", type=Path, default=None, help="the node's data dir (default: the app's)")
    p.add_argument("--model", default=None,
                   help="which trained model (catalog id, seed or a model folder; default: the one the node trains)")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, default="f16",
                   help="float type of the merged GGUF (default f16, what llama.cpp tools expect)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()

    def progress(message: str) -> None:  # every step says when it starts: a slow one is never silent
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    progress("loading the libraries")
    import transformers

    from engine.export import ExportError, export_model

    warnings.filterwarnings("ignore", category=FutureWarning)  # libraries' deprecation notes, not the user's
    transformers.logging.set_verbosity_error()  # its load reports would bury the steps
    transformers.logging.disable_progress_bar()
    data_dir = (args.data_dir or default_data_dir()).expanduser()
    try:
        result = export_model(data_dir, args.out, model=args.model, gguf_type=args.gguf_type, progress=progress)
    except ExportError as exc:
        print(f"sapo export: {exc}", file=sys.stderr)
        return 1
    kind = "LoRA adapter (PEFT) + merged GGUF" if result.lora else "full model (transformers) + GGUF"
    print(f"\n{result.model_id}, round {result.round} ({result.updates} updates): {kind} in {result.out}")
    for name in result.files:
        size = (result.out / name).stat().st_size
        print(f"  {name:<48} {size / 2**20:9.1f} MiB")
    print(f"Try it: llama-cli -m {result.gguf} -p \"What is 12 + 30?\"  ·  Ollama: cd {result.out} && "
          f"ollama create sapo -f Modelfile  ·  README.md says more")
    return 0
