"""The llama.cpp C library, bound with ctypes: the ~25 functions the runtime calls, from whichever build
is installed, with no compiler at install time.

Two builds are known. `xllamacpp` ships prebuilt wheels whose one extension module exports llama.cpp's
whole C API (no AVX512 kernels: built for AVX2); `llama-cpp-python` compiles llama.cpp on install (its
own kernels for this CPU, or the portable variants of the desktop bundle). Which one is used: the
`SAPO_LLAMA_LIB` path if set, else llama-cpp-python's build when installed (the fast path), else
xllamacpp's.

The two builds' `llama_context_params` differ in layout, and a struct passed by value with a wrong
layout corrupts silently. So the layout is never assumed: each default-params function is called into
a canary-filled buffer, which gives the struct's size and its default values, and the offsets of the
few fields set here are taken from the known layout whose size and defaults match. A build that
matches none is refused with its size named, not run.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import SapoError

LIB_ENV = "SAPO_LLAMA_LIB"  # a libllama (or xllamacpp extension) path to load instead
CANARY = 0xA5
PROBE_BYTES = 1024


class LlamaLibError(SapoError, RuntimeError):
    """No llama.cpp library, or one whose ABI this module does not know."""


@dataclass(frozen=True)
class Layout:
    """Where the fields set here lie in one build's `llama_context_params` (bytes), and its size."""

    name: str
    size: int
    n_threads: int  # n_threads, then n_threads_batch
    type_k: int  # type_k, then type_v
    bools: int  # embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified


# n_ctx, n_batch, n_ubatch, n_seq_max lie at 0..15 in both; the defaults checked are llama.cpp's.
CONTEXT_LAYOUTS = (
    Layout("llama.cpp of llama-cpp-python 0.3.36", 160, n_threads=28, type_k=104, bools=128),
    Layout("llama.cpp of xllamacpp 2026.10", 168, n_threads=28, type_k=104, bools=136),
)
MODEL_PARAMS_BYTES = 80  # llama_model_params: the same in both (78 bytes written, 8-aligned)
N_GPU_LAYERS_AT = 16  # devices and tensor_buft_overrides (2 pointers) come first


def _defaults(fn: Any) -> bytes:
    """What a `llama_*_default_params` function writes, up to its last written byte. A struct this large
    is returned through a hidden pointer on every 64-bit ABI llama.cpp supports, so calling it with
    our own buffer as that pointer is the call the C compiler makes."""
    buf = (ctypes.c_ubyte * PROBE_BYTES)(*([CANARY] * PROBE_BYTES))
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    fn(ctypes.addressof(buf))
    raw = bytes(buf)
    written = [i for i in range(PROBE_BYTES) if raw[i] != CANARY]
    return raw[:written[-1] + 1] if written else b""


def context_layout(defaults: bytes) -> Layout:
    """The known layout these default bytes fit (size and llama.cpp's default values), else an error."""
    def u32(at: int) -> int:
        return int.from_bytes(defaults[at:at + 4], "little")

    size = -(-len(defaults) // 8) * 8
    for layout in CONTEXT_LAYOUTS:
        if size != layout.size:
            continue
        fits = ([u32(0), u32(4), u32(8), u32(12)] == [512, 2048, 512, 1]
                and u32(layout.n_threads) == u32(layout.n_threads + 4) > 0
                and [u32(layout.type_k), u32(layout.type_k + 4)] == [1, 1]  # GGML_TYPE_F16
                and list(defaults[layout.bools:layout.bools + 6]) == [0, 1, 1, 1, 1, 0])
        if fits:
            return layout
    raise LlamaLibError(f"this llama.cpp build's llama_context_params ({len(defaults)} bytes) fits no layout "
                        f"SAPO knows ({', '.join(f'{x.name}: {x.size}' for x in CONTEXT_LAYOUTS)}); "
                        "install xllamacpp==2026.10.11549 or llama-cpp-python==0.3.36")


def _struct_type(name: str, size: int, fields: list[tuple[str, Any, int]]) -> type[ctypes.Structure]:
    """A ctypes struct of exactly `size` bytes with `fields` (name, type, offset) and opaque bytes
    between them (kept from the defaults, never written)."""
    layout: list[tuple[str, Any]] = []
    at = 0
    for field, kind, offset in sorted(fields, key=lambda f: f[2]):
        if offset > at:
            layout.append((f"_opaque_{at}", ctypes.c_ubyte * (offset - at)))
        layout.append((field, kind))
        at = offset + ctypes.sizeof(kind)
    if size > at:
        layout.append((f"_opaque_{at}", ctypes.c_ubyte * (size - at)))
    struct = type(name, (ctypes.Structure,), {"_fields_": layout, "_pack_": 8})
    if ctypes.sizeof(struct) != size:  # an alignment pad would shift the fields: never pass it then
        raise LlamaLibError(f"{name}: built {ctypes.sizeof(struct)} bytes, expected {size}")
    return struct


class LlamaBatch(ctypes.Structure):
    """`llama_batch`, unchanged across the builds known here."""

    _fields_ = [("n_tokens", ctypes.c_int32), ("token", ctypes.POINTER(ctypes.c_int32)),
                ("embd", ctypes.POINTER(ctypes.c_float)), ("pos", ctypes.POINTER(ctypes.c_int32)),
                ("n_seq_id", ctypes.POINTER(ctypes.c_int32)),
                ("seq_id", ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))),
                ("logits", ctypes.POINTER(ctypes.c_int8))]


BUILD_PACKAGES = (("llama-cpp-python", "llama_cpp", "lib/libllama.*"), ("xllamacpp", "xllamacpp", "xllamacpp*.so"))


def installed_builds() -> dict[str, Path]:
    """Each installed llama.cpp build's library, fastest first (llama-cpp-python's own compile, then
    xllamacpp's prebuilt one)."""
    found: dict[str, Path] = {}
    for build, package, pattern in BUILD_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec and spec.origin:
            libs = sorted(Path(spec.origin).parent.glob(pattern), key=lambda p: len(p.name))
            if libs:
                found[build] = libs[0]
    return found


def library_path() -> Path:
    """The llama.cpp library to load: `SAPO_LLAMA_LIB`, llama-cpp-python's build, or xllamacpp's."""
    if os.environ.get(LIB_ENV):
        path = Path(os.environ[LIB_ENV])
        if not path.is_file():
            raise LlamaLibError(f"{LIB_ENV}={path} is not a file")
        return path
    builds = installed_builds()
    if builds:
        return next(iter(builds.values()))
    raise LlamaLibError("the llama.cpp backend needs llama.cpp: `pip install xllamacpp==2026.10.11549` "
                        "(prebuilt), or llama-cpp-python==0.3.36 (compiled on install, a few minutes)")


def build_name(path: Path) -> str:
    """Which build a library path is: "xllamacpp", "llama-cpp-python", or "custom"."""
    parts = set(path.resolve().parts)
    return "xllamacpp" if "xllamacpp" in parts else "llama-cpp-python" if "llama_cpp" in parts else "custom"


_p, _i32, _u32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32
LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


GGML_LOG_LEVEL_ERROR = 4
LOG = logging.getLogger("llama.cpp")


@LOG_CALLBACK
def _log_errors(level: int, text: bytes, user: Any) -> None:
    """llama.cpp's log, which would otherwise print every load to stderr: its errors (why a model or
    adapter did not load) go to Python's log, the rest is dropped."""
    if level == GGML_LOG_LEVEL_ERROR and text:
        LOG.error("%s", text.decode(errors="replace").rstrip())


class LlamaLib:
    """The functions of one loaded llama.cpp library, with prototypes (the names are llama.cpp's)."""

    def __init__(self, path: Path) -> None:
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LlamaLibError(f"could not load llama.cpp from {path}: {exc}") from exc
        self.path, self.build = path, build_name(path)
        self.layout = context_layout(_defaults(self.lib.llama_context_default_params))
        self.ContextParams = _struct_type("ContextParams", self.layout.size, [
            ("n_ctx", _u32, 0), ("n_batch", _u32, 4), ("n_ubatch", _u32, 8), ("n_seq_max", _u32, 12),
            ("n_threads", _i32, self.layout.n_threads), ("n_threads_batch", _i32, self.layout.n_threads + 4),
            ("type_k", ctypes.c_int, self.layout.type_k), ("type_v", ctypes.c_int, self.layout.type_k + 4),
            ("no_perf", ctypes.c_bool, self.layout.bools + 2), ("kv_unified", ctypes.c_bool, self.layout.bools + 5)])
        self.ModelParams = _struct_type("ModelParams", MODEL_PARAMS_BYTES, [("n_gpu_layers", _i32, N_GPU_LAYERS_AT)])
        model_defaults = _defaults(self.lib.llama_model_default_params)
        if not 64 < len(model_defaults) <= MODEL_PARAMS_BYTES:
            raise LlamaLibError(f"this llama.cpp build's llama_model_params is {len(model_defaults)} bytes, "
                                f"not the {MODEL_PARAMS_BYTES} SAPO knows")
        self._bind()
        self.lib.llama_log_set(_log_errors, None)

    def _bind(self) -> None:
        f = self.lib
        protos: dict[str, tuple[Any, list[Any]]] = {
            "llama_backend_init": (None, []),
            "llama_print_system_info": (ctypes.c_char_p, []),
            "llama_model_default_params": (self.ModelParams, []),
            "llama_model_load_from_file": (_p, [ctypes.c_char_p, self.ModelParams]),
            "llama_model_free": (None, [_p]),
            "llama_model_get_vocab": (_p, [_p]),
            "llama_vocab_n_tokens": (_i32, [_p]),
            "llama_adapter_lora_init": (_p, [_p, ctypes.c_char_p]),
            "llama_adapter_lora_free": (None, [_p]),
            "llama_set_adapters_lora": (_i32, [_p, ctypes.POINTER(_p), ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_float)]),
            "llama_context_default_params": (self.ContextParams, []),
            "llama_init_from_model": (_p, [_p, self.ContextParams]),
            "llama_free": (None, [_p]),
            "llama_set_n_threads": (None, [_p, _i32, _i32]),
            "llama_n_threads": (_i32, [_p]),
            "llama_n_threads_batch": (_i32, [_p]),
            "llama_decode": (_i32, [_p, LlamaBatch]),
            "llama_get_logits": (ctypes.POINTER(ctypes.c_float), [_p]),
            "llama_get_memory": (_p, [_p]),
            "llama_memory_clear": (None, [_p, ctypes.c_bool]),
            "llama_memory_seq_rm": (ctypes.c_bool, [_p, _i32, _i32, _i32]),
            "llama_memory_seq_cp": (None, [_p, _i32, _i32, _i32, _i32]),
            "llama_batch_init": (LlamaBatch, [_i32, _i32, _i32]),
            "llama_batch_free": (None, [LlamaBatch]),
            "llama_log_set": (None, [LOG_CALLBACK, _p]),
        }
        for name, (restype, argtypes) in protos.items():
            fn = getattr(f, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
    llama_adapter_lora_p_ctypes = _p


@functools.cache
def load() -> LlamaLib:
    """The process's llama.cpp library, loaded and checked once."""
    lib = LlamaLib(library_path())
    lib.llama_backend_init()
    return lib


def build_label(lib: LlamaLib) -> str:
    """The build in use, as a contributor would install it: "xllamacpp 2026.10.11549" and the like."""
    from importlib.metadata import PackageNotFoundError, version

    if lib.build == "custom":
        return f"custom ({lib.path})"
    try:
        return f"{lib.build} {version(lib.build)}"  # the build names are their distributions' names
    except PackageNotFoundError:
        return f"{lib.build} (unknown version)"
