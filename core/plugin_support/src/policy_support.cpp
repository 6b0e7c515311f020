// The non-template half of the plugin-support library: entry negotiation, exception mapping,
// reasons, parameter checks and lookups, generic geometry/selection checks, PolicyBase services.
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <new>

#include "sieve/plugin/policy_api.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/hook_names.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::plugin {

// ---- errors ----------------------------------------------------------------------------------
sieve_status current_exception_status(std::string& message) noexcept {
  try {
    try {
      throw;
    } catch (const Error& e) {  // the plugin's own, or from an internal library (core/selection)
      message = e.what();
      return e.status() == SIEVE_OK ? SIEVE_ERR_INTERNAL : e.status();
    } catch (const std::bad_alloc&) {
      message = "out of host memory";
      return SIEVE_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
      message = std::string("internal error: ") + e.what();
      return SIEVE_ERR_INTERNAL;
    } catch (...) {
      message = "internal error: unknown exception";
      return SIEVE_ERR_INTERNAL;
    }
  } catch (...) {  // building the message itself failed (out of memory)
    return SIEVE_ERR_OUT_OF_MEMORY;
  }
}

// ---- reasons ---------------------------------------------------------------------------------
void emit(sieve_reason_sink sink, const char* message) noexcept {
  if (sink.reason) sink.reason(sink.ctx, message);
}

void Reasons::add(sieve_status status, std::string message) {
  if (status == SIEVE_OK) status = SIEVE_ERR_INTERNAL;
  // INVALID_ARGUMENT dominates: the request is wrong whatever else is unsupported.
  if (status_ == SIEVE_OK || status == SIEVE_ERR_INVALID_ARGUMENT) status_ = status;
  emit(sink_, message.c_str());
  messages_.push_back(std::move(message));
}

std::string Reasons::joined() const {
  std::string out;
  for (const auto& m : messages_) out += (out.empty() ? "" : "; ") + m;
  return out;
}

// ---- parameters ------------------------------------------------------------------------------
const char* param_type_name(uint32_t type) noexcept {
  switch (type) {
    case SIEVE_PARAM_BOOL: return "bool";
    case SIEVE_PARAM_INT: return "int";
    case SIEVE_PARAM_FLOAT: return "float";
    case SIEVE_PARAM_STRING: return "string";
    case SIEVE_PARAM_ENUM: return "enum";
    case SIEVE_PARAM_INT_LIST: return "int list";
  }
  return "unknown type";
}

namespace {
// A bound or value as a user writes it: integers without exponent, others in shortest form.
std::string number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15)
    return std::to_string(int64_t(v));
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}
std::string range(const sieve_param_spec& s) {
  return str("[", number(s.min), ", ", number(s.max), "]");
}

size_t count_choices(const char* choices) {
  if (!choices || !*choices) return 0;
  size_t n = 1;
  for (const char* c = choices; *c; ++c) n += *c == '|';
  return n;
}
}  // namespace

bool Params::check(const sieve_param_spec* specs, uint32_t n_specs, const sieve_param_value* values,
                   uint32_t n_values, Reasons& reasons) {
  const size_t before = reasons.messages().size();
  if (n_values != n_specs) {
    std::string names;
    for (uint32_t i = 0; i < n_specs; ++i) names += (i ? ", " : "") + std::string(specs[i].name);
    reasons.invalid("expected ", n_specs, " parameter value(s)", n_specs ? " (" + names + ")" : "",
                    ", got ", n_values);
    return false;
  }
  if (n_values > 0 && !values) {
    reasons.invalid("parameter values are NULL");
    return false;
  }
  for (uint32_t i = 0; i < n_specs; ++i) {
    const sieve_param_spec& s = specs[i];
    const sieve_param_value& v = values[i];
    const std::string what = str("parameter '", s.name, "'");
    if (v.type != s.type) {
      reasons.invalid(what, " is a ", param_type_name(s.type), ", got a value of type ",
                      param_type_name(v.type));
      continue;
    }
    switch (s.type) {
      case SIEVE_PARAM_BOOL:
        if (v.i != 0 && v.i != 1) reasons.invalid(what, " = ", v.i, " is not a bool (0 or 1)");
        break;
      case SIEVE_PARAM_INT:
        if (double(v.i) < s.min || double(v.i) > s.max)
          reasons.invalid(what, " = ", v.i, " is outside ", range(s));
        break;
      case SIEVE_PARAM_FLOAT:
        if (!std::isfinite(v.f) || v.f < s.min || v.f > s.max)
          reasons.invalid(what, " = ", number(v.f), " is outside ", range(s));
        break;
      case SIEVE_PARAM_STRING:
        if (!v.s) reasons.invalid(what, " has a NULL string");
        break;
      case SIEVE_PARAM_ENUM:
        if (v.i < 0 || size_t(v.i) >= count_choices(s.choices))
          reasons.invalid(what, " index ", v.i, " is not one of '", s.choices ? s.choices : "", "'");
        break;
      case SIEVE_PARAM_INT_LIST:
        if (v.list_len > 0 && !v.list) {
          reasons.invalid(what, " has ", v.list_len, " entries but a NULL list");
          break;
        }
        for (uint32_t k = 0; k < v.list_len; ++k)
          if (double(v.list[k]) < s.min || double(v.list[k]) > s.max) {
            reasons.invalid(what, " entry ", k, " = ", v.list[k], " is outside ", range(s));
            break;
          }
        break;
      default:
        reasons.invalid(what, " has unknown type ", s.type);
    }
  }
  return reasons.messages().size() == before;
}

Params::Params(const sieve_param_spec* specs, uint32_t n_specs, const sieve_param_value* values,
               uint32_t n_values)
    : specs_(specs), values_(values), n_(n_specs) {
  Reasons reasons;
  if (!check(specs, n_specs, values, n_values, reasons))
    throw Error(SIEVE_ERR_INVALID_ARGUMENT, reasons.joined());
}

const sieve_param_value& Params::value(std::string_view name, sieve_param_type type) const {
  for (uint32_t i = 0; i < n_; ++i) {
    if (name != specs_[i].name) continue;
    if (specs_[i].type != uint32_t(type))
      fail(SIEVE_ERR_INTERNAL, "parameter '", name, "' is a ", param_type_name(specs_[i].type),
           ", read as a ", param_type_name(type));
    return values_[i];
  }
  fail(SIEVE_ERR_INTERNAL, "parameter '", name, "' is not in the schema");
}

int64_t Params::integer(std::string_view name) const { return value(name, SIEVE_PARAM_INT).i; }
double Params::real(std::string_view name) const { return value(name, SIEVE_PARAM_FLOAT).f; }
bool Params::boolean(std::string_view name) const { return value(name, SIEVE_PARAM_BOOL).i != 0; }
uint32_t Params::choice(std::string_view name) const {
  return uint32_t(value(name, SIEVE_PARAM_ENUM).i);
}
std::string_view Params::text(std::string_view name) const {
  for (uint32_t i = 0; i < n_; ++i)
    if (name == specs_[i].name && specs_[i].type == SIEVE_PARAM_ENUM)
      return values_[i].s ? values_[i].s : "";
  const char* s = value(name, SIEVE_PARAM_STRING).s;
  return s ? s : "";
}
std::span<const int64_t> Params::int_list(std::string_view name) const {
  const sieve_param_value& v = value(name, SIEVE_PARAM_INT_LIST);
  return {v.list, v.list_len};
}

// ---- checks ----------------------------------------------------------------------------------
const char* device_type_name(int32_t device_type) noexcept {
  switch (device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda-host";
    case kDLCUDAManaged: return "cuda-managed";
    default: return "other device";
  }
}

void check_geometry(const sieve_policy_descriptor& d, const sieve_geometry& g, Reasons& r) {
  auto positive = [&](int32_t v, const char* name) {
    if (v <= 0) r.invalid("geometry ", name, " = ", v, " must be > 0");
  };
  positive(g.n_layers, "n_layers");
  positive(g.n_q_heads, "n_q_heads");
  positive(g.n_kv_heads, "n_kv_heads");
  positive(g.head_dim, "head_dim");
  positive(g.page_size, "page_size");
  positive(g.max_batch, "max_batch");
  positive(g.max_seq_len, "max_seq_len");
  if (g.n_q_heads > 0 && g.n_kv_heads > 0 && g.n_q_heads % g.n_kv_heads != 0)
    r.invalid("geometry n_q_heads = ", g.n_q_heads, " is not a multiple of n_kv_heads = ",
              g.n_kv_heads);

  const uint32_t kv_bit = dtype_bit(g.kv_dtype);
  if (!kv_bit)
    r.invalid("KV dtype ", dtype_name(g.kv_dtype), " is not a storage dtype (f32, f16, bf16)");
  else if (!(d.dtypes & kv_bit))
    r.unsupported("KV dtype ", dtype_name(g.kv_dtype), " is not supported by ", d.name);

  uint32_t device_bit = 0;
  if (g.device.device_type == kDLCPU) device_bit = SIEVE_DEVICE_CPU;
  else if (g.device.device_type == kDLCUDA) device_bit = SIEVE_DEVICE_CUDA;
  if (!device_bit || !(d.devices & device_bit))
    r.unsupported("device ", device_name(g.device), " is not supported by ", d.name,
                  (g.device.device_type == kDLCUDA && !(d.devices & SIEVE_DEVICE_CUDA))
                      ? " (this build has no CUDA code)"
                      : "");

  auto listed = [](const int32_t* list, uint32_t n, int32_t v) {
    if (n == 0) return true;
    for (uint32_t i = 0; i < n; ++i)
      if (list[i] == v) return true;
    return false;
  };
  if (!listed(d.head_dims, d.n_head_dims, g.head_dim))
    r.unsupported("head_dim ", g.head_dim, " is not supported by ", d.name);
  if (!listed(d.page_sizes, d.n_page_sizes, g.page_size))
    r.unsupported("page_size ", g.page_size, " is not supported by ", d.name);
}

int64_t selection_rows(const sieve_layer_call& call, int32_t q_block, int32_t rows_per_block) {
  if (call.batch < 0) fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch, " is negative");
  if (call.batch > 0 && !call.qo_indptr_host)
    fail(SIEVE_ERR_INVALID_ARGUMENT, "qo_indptr_host is NULL");
  int64_t rows = 0;
  for (int32_t b = 0; b < call.batch; ++b) {
    const int64_t n = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
    if (n < 0)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "qo_indptr_host decreases at sequence ", b, " (",
           call.qo_indptr_host[b], " -> ", call.qo_indptr_host[b + 1], ")");
    rows += (n + q_block - 1) / q_block;
  }
  return rows * rows_per_block;
}

void check_selection_storage(const sieve_selection& sel, int64_t n_rows, int64_t nnz,
                             DLDevice device) {
  auto check = [&](const DLTensor& t, const char* what, int64_t need) {
    if (!t.data) fail(SIEVE_ERR_INVALID_ARGUMENT, "selection ", what, " has no data");
    if (!same_dtype(t.dtype, kI32) || t.ndim != 1)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "selection ", what, " must be 1-D int32, got ", t.ndim,
           "-D ", dtype_name(t.dtype));
    if (!is_contiguous(t))
      fail(SIEVE_ERR_INVALID_ARGUMENT, "selection ", what, " must be contiguous");
    if (t.device.device_type != device.device_type || t.device.device_id != device.device_id)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "selection ", what, " is on ", device_name(t.device),
           ", the policy runs on ", device_name(device));
    if (t.shape[0] < need)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "selection ", what, " holds ", t.shape[0],
           " entries, needs ", need);
  };
  if (sel.capacity < 0)
    fail(SIEVE_ERR_INVALID_ARGUMENT, "selection capacity ", sel.capacity, " is negative");
  check(sel.indptr, "indptr", n_rows + 1);
  check(sel.indices, "indices", sel.capacity);
  if (nnz > INT32_MAX)  // indptr is int32
    fail(SIEVE_ERR_CAPACITY, "selection needs ", nnz, " key-block entries, more than int32 indptr holds");
  if (nnz > sel.capacity)
    fail(SIEVE_ERR_CAPACITY, "selection needs ", nnz, " key-block entries for ", n_rows,
         " rows, its capacity is ", sel.capacity);
}

// ---- PolicyBase ------------------------------------------------------------------------------
PolicyBase::PolicyBase(const CreateContext& ctx)
    : services_(ctx.services),
      geometry_(*ctx.geometry),
      kv_(ctx.kv),
      kv_api_(ctx.kv_api),
      name_(ctx.policy_name ? ctx.policy_name : "policy") {
  geometry_.hdr = SIEVE_HEADER_INIT(sieve_geometry);  // our copy has our layout
  last_error_.reserve(256);  // a failing hook should not have to allocate for a short message
}

namespace {
[[noreturn]] void hook_not_implemented(const char* hook) {
  fail(SIEVE_ERR_UNSUPPORTED, hook, " is not implemented by this policy");
}
}  // namespace

void PolicyBase::on_append(const sieve_layer_call&, const sieve_kv_append&) {
  hook_not_implemented("on_append");
}
void PolicyBase::select(const sieve_layer_call&, sieve_selection&, uint32_t&) {
  hook_not_implemented("select");
}
void PolicyBase::attend(const sieve_layer_call&, const sieve_selection&, DLTensor&) {
  hook_not_implemented("attend");
}
void PolicyBase::observe(const sieve_layer_call&, const sieve_attention_stats&) {
  hook_not_implemented("observe");
}
void PolicyBase::correct(const sieve_layer_call&, const sieve_selection&, DLTensor&) {
  hook_not_implemented("correct");
}
void PolicyBase::end_step(const sieve_step_end&) { hook_not_implemented("end_step"); }

void* PolicyBase::cuda_stream() const noexcept {
  return services_->cuda_stream ? services_->cuda_stream(services_->host_ctx) : nullptr;
}

HostBuffer PolicyBase::allocate(DLDevice device, size_t bytes, size_t alignment) const {
  if (!services_->alloc || !services_->free)
    fail(SIEVE_ERR_UNSUPPORTED, "the host offers no allocator (alloc/free is NULL)");
  void* p = services_->alloc(services_->host_ctx, device, bytes, alignment);
  if (!p)
    fail(SIEVE_ERR_OUT_OF_MEMORY, "the host could not allocate ", bytes, " bytes on ",
         device_name(device));
  return HostBuffer(services_, device, p, bytes);
}

void PolicyBase::core_kernel_attend(sieve_attention_args a, std::string_view what) const {
  a.hdr = SIEVE_HEADER_INIT(sieve_attention_args);
  a.n_q_heads = geometry_.n_q_heads;
  a.n_kv_heads = geometry_.n_kv_heads;
  a.head_dim = geometry_.head_dim;
  host_kernel_attend(*services_, a, what);
}

void host_kernel_attend(const sieve_host_services& s, const sieve_attention_args& a, std::string_view what) {
  if (!s.kernels || !s.kernels->attend) fail(SIEVE_ERR_UNSUPPORTED, "the host offers no core attention kernel");
  if (SIEVE_HAS_FIELD(&a, sieve_attention_args, variant) && a.variant &&
      !(SIEVE_HAS_FIELD(s.kernels, sieve_kernels, variants) && (s.kernels->variants & SIEVE_VARIANT_KEY_SPANS)))
    fail(SIEVE_ERR_UNSUPPORTED, what, ": the host's core kernel offers no attention variants "
         "(sieve_kernels.variants lacks SIEVE_VARIANT_KEY_SPANS; ABI 1.1)");
  const sieve_status st = s.kernels->attend(s.host_ctx, &a);
  if (st != SIEVE_OK) fail(st, what, ": ", s.kernels->last_error ? s.kernels->last_error(s.host_ctx) : "");
}

void PolicyBase::log(sieve_log_level level, std::string_view message) const noexcept {
  if (!services_->log) return;
  try {
    const std::string line(message);  // the callback wants a NUL-terminated string
    services_->log(services_->host_ctx, level, name_, line.c_str());
  } catch (...) {  // logging never fails a hook
  }
}

void PolicyBase::set_last_error(const char* hook, const std::string& message) noexcept {
  try {
    last_error_.assign(hook).append(": ").append(message);
  } catch (...) {
    last_error_.clear();
  }
}

// ---- entry -----------------------------------------------------------------------------------
sieve_status negotiate_entry(uint32_t host_major, uint32_t* plugin_major,
                             const sieve_plugin** table, const sieve_plugin* mine) noexcept {
  if (table) *table = nullptr;
  if (!plugin_major || !table || !mine) return SIEVE_ERR_INVALID_ARGUMENT;
  *plugin_major = mine->abi_major;
  if (host_major < mine->abi_major) return SIEVE_ERR_VERSION;
  *table = mine;
  return SIEVE_OK;
}

void detail::check_instance_hooks(uint32_t used, uint32_t overridden) {
  if (used & ~overridden)
    fail(SIEVE_ERR_INTERNAL, "use_hooks() names ", hook_names(used & ~overridden),
         ", which the policy class does not override (it overrides ", hook_names(overridden), ")");
}

}  // namespace sieve::plugin
