"""The llama.cpp binding: layouts are recognised from the library's own defaults, never assumed; a build
whose layout is unknown is refused before any struct is passed; every installed build loads and decodes."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import llama_lib


def defaults_of(layout: llama_lib.Layout, threads: int = 4) -> bytes:
    """The default bytes a build of `layout` writes (llama.cpp's defaults at the layout's offsets)."""
    raw = bytearray(layout.size)
    for at, value in ((0, 512), (4, 2048), (8, 512), (12, 1), (layout.n_threads, threads),
                      (layout.n_threads + 4, threads), (layout.type_k, 1), (layout.type_k + 4, 1)):
        raw[at:at + 4] = value.to_bytes(4, "little")
    raw[layout.bools:layout.bools + 6] = bytes([0, 1, 1, 1, 1, 0])
    return bytes(raw[:layout.bools + 6])  # the last bytes written are the bools' (then pointers, NULL)


@pytest.mark.parametrize("layout", llama_lib.CONTEXT_LAYOUTS, ids=lambda x: str(x.size))
def test_each_known_layout_is_recognised_from_its_defaults(layout: llama_lib.Layout) -> None:
    raw = defaults_of(layout) + bytes(layout.size - layout.bools - 6)
    raw = raw[:-8] + b"\x01" + bytes(7)  # a non-NULL last pointer: the size is what was written
    assert llama_lib.context_layout(raw) == layout


def test_a_layout_of_the_right_size_with_other_defaults_is_refused() -> None:
    layout = llama_lib.CONTEXT_LAYOUTS[0]
    shifted = bytearray(defaults_of(layout) + bytes(layout.size - layout.bools - 7) + b"\x01")
    shifted[layout.type_k:layout.type_k + 4] = (0).to_bytes(4, "little")  # type_k moved elsewhere
    with pytest.raises(llama_lib.LlamaLibError, match=f"{layout.size} bytes.*fits no layout"):
        llama_lib.context_layout(bytes(shifted))
    with pytest.raises(llama_lib.LlamaLibError, match="176 bytes"):
        llama_lib.context_layout(bytes(176))


def test_struct_types_put_fields_at_their_offsets_and_keep_the_rest_opaque() -> None:
    struct = llama_lib._struct_type("T", 40, [("b", ctypes.c_int32, 28), ("a", ctypes.c_uint32, 0),
                                              ("flag", ctypes.c_bool, 33)])
    assert ctypes.sizeof(struct) == 40
    assert (struct.a.offset, struct.b.offset, struct.flag.offset) == (0, 28, 33)
    value = struct.from_buffer_copy(bytes(range(40)))
    value.b = -1
    assert bytes(value)[4:28] == bytes(range(4, 28)) and bytes(value)[34:] == bytes(range(34, 40))


def test_a_missing_library_path_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llama_lib.LIB_ENV, str(tmp_path / "libllama.so"))
    with pytest.raises(llama_lib.LlamaLibError, match="is not a file"):
        llama_lib.library_path()


PROBE = """
from engine.models import llama_lib
lib = llama_lib.load()
params = lib.llama_context_default_params()
assert (params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max) == (512, 2048, 512, 1)
assert params.no_perf and not params.kv_unified and params.type_k == params.type_v == 1
batch = lib.llama_batch_init(8, 0, 1)
batch.token[7] = 3
lib.llama_batch_free(batch)
print(lib.build, lib.layout.size)
"""


@pytest.mark.parametrize("path", llama_lib.installed_builds().values(), ids=lambda p: p.parent.name)
def test_every_installed_build_loads_with_a_known_layout(path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, llama_lib.LIB_ENV: str(path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == llama_lib.build_name(path)


def test_llamacpps_own_errors_reach_the_python_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lib = llama_lib.load()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # a header and nothing after it
    with caplog.at_level("ERROR", logger="llama.cpp"):
        assert not lib.llama_model_load_from_file(str(broken).encode(), lib.llama_model_default_params())
    assert any(r.name == "llama.cpp" and r.levelname == "ERROR" for r in caplog.records), caplog.text
