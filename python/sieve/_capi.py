"""The C host API (api/sieve/host.h) as ctypes declarations: structs, prototypes, the library.

One place mirrors the C layout; everything else in the package talks to `lib` through these
prototypes. Structs start with a sieve_header {struct_size, version}: `new(Struct)` fills it so
the runtime reads exactly the fields this mirror declares (a newer runtime keeps working).
"""
import ctypes as C
import os

from . import _location

# Host API minor this mirror declares (sieve_session_options.cuda_stream is 1.2).
HOST_API_MAJOR, HOST_API_MINOR = 1, 2
ABI_MINOR = 1  # SIEVE_ABI_MINOR: what SIEVE_HEADER_INIT writes into header.version

PHASE_PREFILL, PHASE_DECODE = 1, 2
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "unsupported", 3: "version", 4: "out of memory",
                5: "capacity", 6: "device", 7: "not found", 8: "internal"}
PARAM_TYPES = {0: "bool", 1: "int", 2: "float", 3: "string", 4: "enum", 5: "int_list"}
RUNTIME_NO_ENV, RUNTIME_NO_DEFAULT_DIRS, RUNTIME_NO_PROBE = 1, 2, 4

# DLPack device types and dtype codes (dlpack.h).
DL_CPU, DL_CUDA = 1, 2
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT = 0, 1, 2, 4


class Header(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("version", C.c_uint32)]


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32), ("dtype", DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class Geometry(C.Structure):
    _fields_ = [("hdr", Header), ("n_layers", C.c_int32), ("n_q_heads", C.c_int32), ("n_kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("page_size", C.c_int32), ("max_batch", C.c_int32),
                ("max_seq_len", C.c_int32), ("kv_dtype", DLDataType), ("device", DLDevice),
                ("rope_theta", C.c_float), ("rope_dim", C.c_int32)]


class RuntimeOptions(C.Structure):
    _fields_ = [("hdr", Header), ("flags", C.c_uint32)]


class ParamSpec(C.Structure):
    _fields_ = [("hdr", Header), ("name", C.c_char_p), ("type", C.c_uint32), ("default_value", C.c_char_p),
                ("min", C.c_double), ("max", C.c_double), ("choices", C.c_char_p), ("doc", C.c_char_p)]


class PolicyDescriptor(C.Structure):  # the 1.0 prefix: what plugins() reports
    _fields_ = [("hdr", Header), ("name", C.c_char_p), ("vendor", C.c_char_p), ("version_major", C.c_uint32),
                ("version_minor", C.c_uint32), ("version_patch", C.c_uint32), ("summary", C.c_char_p),
                ("phases", C.c_uint32), ("devices", C.c_uint32), ("dtypes", C.c_uint32)]


class KvStoreDescriptor(C.Structure):  # its header and name
    _fields_ = [("hdr", Header), ("name", C.c_char_p)]


class PluginInfo(C.Structure):
    _fields_ = [("hdr", Header), ("name", C.c_char_p), ("path", C.c_char_p), ("abi_major", C.c_uint32),
                ("abi_minor", C.c_uint32), ("descriptor", C.POINTER(PolicyDescriptor)),
                ("params", C.c_void_p), ("n_params", C.c_uint32), ("params_stride", C.c_uint32),
                ("kv_store_descriptor", C.POINTER(KvStoreDescriptor)), ("kv_store_params", C.c_void_p),
                ("n_kv_store_params", C.c_uint32), ("kv_store_params_stride", C.c_uint32),
                ("tools", C.c_void_p), ("n_tools", C.c_uint32), ("builtin", C.c_uint32)]


class PageReleaseSink(C.Structure):  # sieve_page_release_sink: {ctx, release}
    _fields_ = [("ctx", C.c_void_p), ("release", C.c_void_p)]


class SessionOptions(C.Structure):
    _fields_ = [("hdr", Header), ("pages_per_layer", C.c_int32), ("check", C.c_int32), ("kv_store", C.c_char_p),
                ("kv_store_api", C.c_void_p), ("kv_store_instance", C.c_void_p), ("release", PageReleaseSink),
                ("cuda_stream", C.c_void_p)]


class LayerInputs(C.Structure):
    _fields_ = [("hdr", Header), ("layer", C.c_int32), ("phase", C.c_uint32), ("batch", C.c_int32),
                ("seq_ids", C.POINTER(C.c_int32)), ("qo_indptr", C.POINTER(C.c_int32)),
                ("positions", C.POINTER(C.c_int32)), ("q", C.c_void_p), ("k", C.c_void_p), ("v", C.c_void_p),
                ("q_pre_rope", C.c_void_p), ("k_pre_rope", C.c_void_p)]


def new(struct, **fields):
    """A zeroed struct with its header set (SIEVE_HEADER_INIT), then `fields`."""
    s = struct(hdr=Header(C.sizeof(struct), ABI_MINOR))
    for k, v in fields.items():
        setattr(s, k, v)
    return s


_P = C.c_void_p
_PROTOTYPES = {
    # name: (restype, argtypes)
    "sieve_host_api_version": (C.c_uint32, []),
    "sieve_runtime_create": (C.c_int, [C.POINTER(RuntimeOptions), C.POINTER(_P)]),
    "sieve_runtime_destroy": (None, [_P]),
    "sieve_runtime_last_error": (C.c_char_p, [_P]),
    "sieve_runtime_add_plugin_dir": (C.c_int, [_P, C.c_char_p]),
    "sieve_runtime_plugin_count": (C.c_int, [_P, C.POINTER(C.c_uint32)]),
    "sieve_runtime_plugin_info": (C.c_int, [_P, C.c_uint32, C.POINTER(PluginInfo)]),
    "sieve_runtime_failure_count": (C.c_int, [_P, C.POINTER(C.c_uint32)]),
    "sieve_runtime_failure": (C.c_char_p, [_P, C.c_uint32]),
    "sieve_chain_parse": (C.c_int, [_P, C.c_char_p, C.POINTER(_P)]),
    "sieve_chain_load_file": (C.c_int, [_P, C.c_char_p, C.POINTER(_P)]),
    "sieve_chain_destroy": (None, [_P]),
    "sieve_chain_text": (C.c_char_p, [_P]),
    "sieve_session_create": (C.c_int, [_P, C.POINTER(Geometry), _P, C.POINTER(SessionOptions), C.POINTER(_P)]),
    "sieve_session_destroy": (None, [_P]),
    "sieve_session_last_error": (C.c_char_p, [_P]),
    "sieve_session_add_sequence": (C.c_int, [_P, C.POINTER(C.c_int32)]),
    "sieve_session_remove_sequence": (C.c_int, [_P, C.c_int32]),
    "sieve_session_seq_len": (C.c_int, [_P, C.c_int32, C.c_int32, C.POINTER(C.c_int32)]),
    "sieve_session_attend": (C.c_int, [_P, C.POINTER(LayerInputs), _P]),
    "sieve_session_end_step": (C.c_int, [_P, C.c_uint32, C.POINTER(C.c_int32), C.c_int32]),
    "sieve_session_synchronize": (C.c_int, [_P]),
    "sieve_session_cuda_stream": (_P, [_P]),
    "sieve_session_kv_store_name": (C.c_char_p, [_P]),
    "sieve_session_kv_bytes": (C.c_int, [_P, C.POINTER(C.c_uint64)]),
}


def library_path():
    """$SIEVE_LIBRARY if set, else the runtime this package was built or installed with."""
    env = os.environ.get("SIEVE_LIBRARY")
    if env:
        return env
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), _location.RUNTIME_LIBRARY))


def load(path=None):
    path = path or library_path()
    # RTLD_LOCAL, as a Python extension is loaded (RTLD_DEEPBIND was tried: it did not help, see
    # _Library).
    mode = C.RTLD_LOCAL
    try:
        lib = C.CDLL(path, mode=mode)
    except OSError as e:
        raise ImportError("sieve: cannot load the Sieve runtime %s (%s); build it (cmake --build) or set "
                          "SIEVE_LIBRARY to libsieve_runtime.so" % (path, e)) from None
    for name, (restype, argtypes) in _PROTOTYPES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes
    version = lib.sieve_host_api_version()
    major, minor = version >> 16, version & 0xFFFF
    if major != HOST_API_MAJOR or minor < HOST_API_MINOR:
        raise ImportError("sieve: %s speaks host API %d.%d, this package needs %d.%d or a later 1.x"
                          % (path, major, minor, HOST_API_MAJOR, HOST_API_MINOR))
    return lib


class _Library:
    """The runtime library, loaded at its first use (the first Runtime, say), not at `import sieve`:
    on the GPU machine the runtime's C++ dependencies loaded before torch's made a later
    `import torch` abort in free(), with or without RTLD_DEEPBIND, while every process that loaded
    torch first ran clean. So `import sieve` loads nothing, and what torch needs is in place first
    whenever torch is imported before the first Runtime
    (test_torch.py::test_sieve_and_torch_import_in_either_order)."""
    _loaded = None

    def __getattr__(self, name):
        # Only for names not yet looked up: each is kept on the instance, so a binding call on the
        # hot path is a plain attribute read, not a Python call per C function.
        if _Library._loaded is None:
            _Library._loaded = load()
        value = getattr(_Library._loaded, name)
        setattr(self, name, value)
        return value


lib = _Library()
