"""The llama.cpp side of `engine.models.llamacpp`: thin ctypes glue around one GGUF model and a context
grown on demand. Every prompt is prefilled once and its KV cells copied to its n samples' sequences
(`llama_memory_seq_cp`); all live rows advance in one `llama_decode` per step, and numpy samples each
step (`engine.models.sampling_np`, the semantics of `engine.models.generate`).
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.machine.governor import safe_point
from engine.models.generate import SampleConfig
from engine.models.llama_lib import load as load_library
from engine.models.sampling_np import sample_rows

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: rows (prompts x n) in one call
BATCH_TOKENS = 512  # tokens per llama_decode call (prompt prefill is packed up to this)
KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32 / GGML_TYPE_F16
KV_LAYOUTS = ("auto", "split", "unified")
WEIGHT_TYPES = ("auto", "f32", "f16", "bf16")
CELL_PAD = 256  # llama.cpp pads each KV stream to a multiple of 256 cells anyway


def _lib() -> Any:
    lib = load_library()  # raises LlamaLibError (a RuntimeError) naming what to install
    load_cpu_backends()
    return lib


@functools.cache
def load_cpu_backends() -> int:
    """Backends llama.cpp can use -> how many. A portable llama-cpp-python build (the desktop bundle's:
    GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS) registers none by itself: ggml then loads, from the
    library's folder, the libggml-cpu-<variant>.so that best fits this CPU (AVX512/bf16 where present,
    plain x86-64 at worst). A default build, and xllamacpp's, has its CPU backend linked in: nothing to do."""
    lib = load_library()
    lib_dir = lib.path.resolve().parent
    # The ggml that libllama itself links to (by soname): wheels and bundles hold libggml.so and
    # libggml.so.0 as two files, and each copy would keep its own backend registry.
    linked = sorted(lib_dir.glob("libggml.so.[0-9]*"), key=lambda p: len(p.name)) or sorted(lib_dir.glob("libggml.*"))
    if lib.build == "xllamacpp" or not linked:
        return 1
    ggml = ctypes.CDLL(str(linked[0]))
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_count.argtypes = []
    if ggml.ggml_backend_reg_count() == 0:
        ggml.ggml_backend_load_all_from_path.restype = None
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
    return int(ggml.ggml_backend_reg_count())


@functools.cache
def native_bf16() -> bool:
    """Whether this llama.cpp build computes bf16 dot products in hardware (x86 AVX512-BF16)."""
    lib = _lib()
    return "AVX512_BF16 = 1" in lib.llama_print_system_info().decode(errors="replace")


def _round_up(n: int, to: int = CELL_PAD) -> int:
    return -(-n // to) * to


class LlamaCppRuntime:
    """One GGUF model in llama.cpp with a context grown on demand. Not thread-safe: one caller.

    KV layouts: "split" gives every row its own KV stream (a row attends over its own cells only, but
    each sample's copy of the prompt is a physical copy and every stream costs per-step overhead);
    "unified" is one cache shared by all rows (a prompt's cells are shared by its samples, but each
    row scans every live cell: cost grows with rows x all cells x layers x heads). Which is faster
    depends on the model and the machine (the seed model: unified by ~1.3x; SmolLM2-135M: split by
    ~1.35x, bench/generate.md), so "auto" measures: for each batch shape it runs one call in each
    layout, then keeps the one that generated more tokens per second.
    """

    def __init__(self, gguf_path: Path, *, threads: int, kv_type: str = "f16", gpu_layers: int = 0,
                 kv_layout: str = "split") -> None:
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        self.lib = _lib()  # loaded and initialised once per process
        self.threads, self.kv_type, self.gpu_layers = max(1, threads), kv_type, gpu_layers
        self.kv_layout = kv_layout
        self.layout_speed: dict[tuple[str, int], float] = {}  # (layout, rows) -> tokens/s measured
        self.last_layout = ""
        self.model: Any = None
        self.ctx: Any = None
        self.adapter: Any = None
        self._ctx_key = ("", 0, 0)  # (layout, cells per sequence or in all, sequences) of the live context
        self.load(gguf_path)

    def load(self, gguf_path: Path) -> None:
        """(Re)load the model weights; the context and any adapter are dropped."""
        self._free_context()
        self.set_adapter(None)
        if self.model is not None:
            self.lib.llama_model_free(self.model)
            self.model = None
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = self.gpu_layers
        model = self.lib.llama_model_load_from_file(str(gguf_path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.model = model
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(model)))

    def set_adapter(self, path: Path | None) -> None:
        """Hot-swap the LoRA adapter (None removes it); the old one is freed after the switch."""
        old = self.adapter
        self.adapter = None
        if path is not None:
            adapter = self.lib.llama_adapter_lora_init(self.model, str(path).encode())
            if not adapter:
                raise RuntimeError(f"llama.cpp could not load the LoRA adapter {path}")
            self.adapter = adapter
        if self.ctx is not None:
            self._apply_adapter()
        if old is not None:
            self.lib.llama_adapter_lora_free(old)

    def _apply_adapter(self) -> None:
        if self.adapter is None:
            rc = self.lib.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            adapters = (self.lib.llama_adapter_lora_p_ctypes * 1)(self.adapter)
            rc = self.lib.llama_set_adapters_lora(self.ctx, adapters, 1, (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise RuntimeError(f"llama.cpp refused the LoRA adapter (code {rc})")

    def _free_context(self) -> None:
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.ctx = None
            self._ctx_key = ("", 0, 0)

    def _context(self, layout: str, cells: int, n_seq: int) -> Any:
        """A context for n_seq sequences with `cells` KV cells per sequence ("split") or in all
        ("unified"); grown, never shrunk, while the layout stays."""
        have_layout, have_cells, have_seq = self._ctx_key
        if have_layout == layout:
            if self.ctx is not None and have_cells >= cells and have_seq >= n_seq:
                return self.ctx
            cells, n_seq = max(cells, have_cells), max(n_seq, have_seq)
        self._free_context()
        params = self.lib.llama_context_default_params()
        params.n_ctx = cells * n_seq if layout == "split" else cells
        params.n_batch = params.n_ubatch = BATCH_TOKENS
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = self.threads
        params.type_k = params.type_v = KV_TYPES[self.kv_type]
        params.kv_unified = layout == "unified"
        params.no_perf = True
        ctx = self.lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a {layout} context of {n_seq} sequences, {cells} cells")
        self.ctx, self._ctx_key = ctx, (layout, cells, n_seq)
        self._apply_adapter()
        return ctx

    def set_threads(self, threads: int) -> None:
        """Threads for the next decodes; a live context takes them at once (no reload)."""
        self.threads = max(1, threads)
        if self.ctx is not None:
            self.lib.llama_set_n_threads(self.ctx, self.threads, self.threads)

    def pick_layout(self, rows: int) -> str:
        """The KV layout for a call of `rows` rows: the configured one, or under "auto" the one not yet
        measured at this shape, else the faster measured one."""
        if self.kv_layout != "auto":
            return self.kv_layout
        untried = [lay for lay in KV_LAYOUTS[1:] if (lay, rows) not in self.layout_speed]
        if untried:
            return untried[0]
        return max(KV_LAYOUTS[1:], key=lambda lay: self.layout_speed[(lay, rows)])

    def _decode(self, batch: Any, tokens: Sequence[tuple[int, int, int, bool]]) -> None:
        """Decode (token, pos, seq, want_logits) entries as one batch."""
        for i, (tok, pos, seq, want) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(want)
        batch.n_tokens = len(tokens)
        rc = self.lib.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc}): context too small or out of memory")

    def _logits(self, rows: int) -> np.ndarray:
        """The last decode's logits [rows, V], a view valid until the next decode."""
        ptr = self.lib.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def _prefill(self, batch: Any, prompt_rows: Sequence[Sequence[int]], n: int) -> np.ndarray:
        """Decode every prompt into sequence p * n, packed into batches of up to 512 tokens ->
        each prompt's next-token logits [P, V]."""
        entries = [(int(t), j, p * n, j == len(prompt) - 1) for p, prompt in enumerate(prompt_rows)
                   for j, t in enumerate(prompt)]
        out = []
        for lo in range(0, len(entries), BATCH_TOKENS):
            chunk = entries[lo:lo + BATCH_TOKENS]
            safe_point()
            self._decode(batch, chunk)
            wanted = sum(1 for e in chunk if e[3])
            if wanted:
                out.append(self._logits(wanted).copy())
        return np.concatenate(out)

    def _compact(self, mem: Any, alive: Sequence[int], stream: list[int], freed: Sequence[int]) -> None:
        """Keep the live rows in streams 0..len(alive)-1: llama.cpp's cost per decode follows the span
        of stream ids in the batch (28 rows scattered over 64 streams measured slower than all 64),
        so rows above the span move into the freed streams below it (one KV copy per finished row)."""
        holes = sorted(s for s in freed if s < len(alive))
        movers = [r for r in alive if stream[r] >= len(alive)]
        for r, hole in zip(movers, holes):
            self.lib.llama_memory_seq_cp(mem, stream[r], hole, -1, -1)
            self.lib.llama_memory_seq_rm(mem, stream[r], -1, -1)
            stream[r] = hole

    def sample(self, prompt_rows: Sequence[Sequence[int]], n: int, cfg: SampleConfig, eos: set[int],
               seed: int) -> list[tuple[list[int], list[float], bool]]:
        """n samples per prompt -> [(tokens, logprobs, stopped)] in prompt-major order (p * n + s)."""
        rows = len(prompt_rows) * n
        if rows > MAX_SEQUENCES:
            raise ValueError(f"{rows} rows exceed llama.cpp's {MAX_SEQUENCES} sequences per context")
        layout = self.pick_layout(rows)
        if layout == "split":
            ctx = self._context(layout, _round_up(max(len(r) for r in prompt_rows) + cfg.max_new_tokens + 1), rows)
        else:  # a prompt's cells are shared by its n samples
            ctx = self._context(layout, _round_up(sum(len(r) for r in prompt_rows) + rows * (cfg.max_new_tokens + 1)),
                                rows)
        started = time.perf_counter()
        mem = self.lib.llama_get_memory(ctx)
        self.lib.llama_memory_clear(mem, True)
        rng = np.random.default_rng(seed)
        batch = self.lib.llama_batch_init(BATCH_TOKENS, 0, 1)
        try:
            first = np.repeat(self._prefill(batch, prompt_rows, n), n, axis=0)  # [rows, V]
            for p in range(len(prompt_rows)):
                for s in range(1, n):  # each prompt was decoded once, into its first sample's sequence
                    self.lib.llama_memory_seq_cp(mem, p * n, p * n + s, -1, -1)
            pos = np.repeat([len(r) for r in prompt_rows], n)  # [rows] next position per row
            tokens: list[list[int]] = [[] for _ in range(rows)]
            logps: list[list[float]] = [[] for _ in range(rows)]
            stopped = [False] * rows
            alive = list(range(rows))
            stream = list(range(rows))  # the KV stream (sequence id) each row lives in
            logits = first
            scratch = np.empty((rows, self.n_vocab), dtype=np.float32)  # the sampler's weights, reused
            for step in range(cfg.max_new_tokens):
                token, logp = sample_rows(logits, cfg, rng, scratch)  # [b], [b]
                still, freed = [], []
                for j, r in enumerate(alive):
                    tokens[r].append(int(token[j]))
                    logps[r].append(float(logp[j]))
                    if int(token[j]) in eos:
                        stopped[r] = True
                        self.lib.llama_memory_seq_rm(mem, stream[r], -1, -1)
                        freed.append(stream[r])
                    else:
                        still.append(j)
                if not still or step == cfg.max_new_tokens - 1:
                    break
                next_token = {alive[j]: int(token[j]) for j in still}
                alive = [alive[j] for j in still]
                if layout == "split":
                    self._compact(mem, alive, stream, freed)
                    alive.sort(key=lambda r: stream[r])  # batch in stream order, as llama.cpp splits it fastest
                safe_point()  # threads follow the owner's load between decodes (llama_set_n_threads)
                self._decode(batch, [(next_token[r], int(pos[r]), stream[r], True) for r in alive])
                pos[alive] += 1
                logits = self._logits(len(alive))
            generated = sum(len(t) for t in tokens)
            self.layout_speed[(layout, rows)] = generated / max(time.perf_counter() - started, 1e-9)
            self.last_layout = layout
            return list(zip(tokens, logps, stopped))
        finally:
            self.lib.llama_batch_free(batch)

    def close(self) -> None:
        self._free_context()
        self.set_adapter(None)
        if self.model is not None:
            self.lib.llama_model_free(self.model)
            self.model = None
