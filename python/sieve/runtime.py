"""Runtime (the plugin registry), its plugins with their parameter schemas, and chains."""
import ctypes as C
from dataclasses import dataclass, field

from . import _capi
from ._capi import lib
from ._errors import SieveError, check
from ._handle import Handle


@dataclass(frozen=True)
class Param:
    """One entry of a plugin's parameter schema (sieve_param_spec)."""
    name: str
    type: str  # bool | int | float | string | enum | int_list
    default: str
    min: float
    max: float
    choices: tuple
    doc: str


@dataclass(frozen=True)
class Plugin:
    """A usable plugin (or one of the runtime's built-in KV stores, builtin=True)."""
    name: str
    path: str
    abi: tuple
    summary: str = ""
    policy: bool = False
    kv_store: bool = False
    builtin: bool = False
    params: tuple = field(default_factory=tuple)
    kv_store_params: tuple = field(default_factory=tuple)


def _text(p):
    return p.decode(errors="replace") if p else ""


def _schema(address, n, stride):
    out = []
    for i in range(n):
        s = C.cast(C.c_void_p(address + i * stride), C.POINTER(_capi.ParamSpec)).contents
        out.append(Param(_text(s.name), _capi.PARAM_TYPES.get(s.type, str(s.type)), _text(s.default_value),
                         s.min, s.max, tuple(c for c in _text(s.choices).split("|") if c), _text(s.doc)))
    return tuple(out)


class Runtime(Handle):
    """A plugin registry: `plugin_dirs` are searched first, then SIEVE_PLUGIN_PATH and the default
    directories (next to libsieve_runtime.so) unless `use_env` / `use_default_dirs` turn them off.

    probe: load each plugin file in a forked probe process before this one (the C runtime's
    default). Off by default here: a Python process is multithreaded (and CUDA-initialised under
    torch), where a forked child may call only async-signal-safe functions, so the probe's dlopen
    can hang or die without an answer (it did on the GPU machine: every plugin refused). Files
    load directly instead; `sieve plugins` / `sieve conform` probe them from a clean process."""

    def __init__(self, plugin_dirs=(), use_env=True, use_default_dirs=True, probe=False):
        flags = ((0 if use_env else _capi.RUNTIME_NO_ENV) | (0 if use_default_dirs else _capi.RUNTIME_NO_DEFAULT_DIRS)
                 | (0 if probe else _capi.RUNTIME_NO_PROBE))
        handle = C.c_void_p()
        status = lib.sieve_runtime_create(C.byref(_capi.new(_capi.RuntimeOptions, flags=flags)), C.byref(handle))
        if status:
            raise SieveError(status, "sieve_runtime_create failed")
        self._h = handle
        if isinstance(plugin_dirs, str):
            plugin_dirs = [plugin_dirs]
        for d in plugin_dirs:
            self.add_plugin_dir(d)

    def _check(self, status):
        check(status, lib.sieve_runtime_last_error, self._h)

    def add_plugin_dir(self, directory):
        self._check(lib.sieve_runtime_add_plugin_dir(self._h, str(directory).encode()))

    def plugins(self):
        """Every usable plugin in search order, then the built-in stores, each with its schema."""
        n = C.c_uint32()
        self._check(lib.sieve_runtime_plugin_count(self._h, C.byref(n)))
        out = []
        for i in range(n.value):
            info = _capi.new(_capi.PluginInfo)
            self._check(lib.sieve_runtime_plugin_info(self._h, i, C.byref(info)))
            summary = _text(info.descriptor.contents.summary) if info.descriptor else ""
            out.append(Plugin(
                name=_text(info.name), path=_text(info.path), abi=(info.abi_major, info.abi_minor),
                summary=summary, policy=bool(info.descriptor), kv_store=bool(info.kv_store_descriptor),
                builtin=bool(info.builtin), params=_schema(info.params or 0, info.n_params, info.params_stride),
                kv_store_params=_schema(info.kv_store_params or 0, info.n_kv_store_params,
                                        info.kv_store_params_stride)))
        return out

    def failures(self):
        """Plugin files found but not loaded: one line each, the file and the reason."""
        n = C.c_uint32()
        self._check(lib.sieve_runtime_failure_count(self._h, C.byref(n)))
        return [_text(lib.sieve_runtime_failure(self._h, i)) for i in range(n.value)]

    def chain(self, spec=None, file=None):
        """A chain from its compact form ("decode:2-=quest(token_budget=256)") or a chain file."""
        return Chain(self, spec=spec, file=file)

    _destroy_name = "sieve_runtime_destroy"


class Chain(Handle):
    """A parsed chain spec: only its syntax is checked here; Session checks plugins and parameters."""

    def __init__(self, runtime, spec=None, file=None):
        if (spec is None) == (file is None):
            raise ValueError("sieve: a chain is a spec or a file, give exactly one")
        self._h = C.c_void_p()
        if spec is not None:
            status = lib.sieve_chain_parse(runtime._h, str(spec).encode(), C.byref(self._h))
        else:
            status = lib.sieve_chain_load_file(runtime._h, str(file).encode(), C.byref(self._h))
        runtime._check(status)

    @property
    def text(self):
        """The chain in compact form, normalised."""
        return _text(lib.sieve_chain_text(self._h))

    def __str__(self):
        return self.text

    def __repr__(self):
        return "sieve.Chain(%r)" % self.text

    _destroy_name = "sieve_chain_destroy"
