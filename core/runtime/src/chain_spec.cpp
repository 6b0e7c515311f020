// Chain specs resolved against the registry and a model's geometry: policies, parameters, phases,
// layers, capabilities and the KV store. Parsing and printing: chain_parse.cpp.
#include "sieve/runtime/chain_spec.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/runtime/policy_hooks.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/status.hpp"

namespace sieve::runtime {

namespace {

std::string phase_label(uint32_t phase) { return phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode"; }

// "0-2,5,7-9"
std::string ranges_text(const std::vector<int32_t>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(layers[i]);
    if (j > i) {
      out += "-";
      out += std::to_string(layers[j]);
    }
    i = j + 1;
  }
  return out;
}

bool device_supported(uint32_t devices, DLDevice d) {
  if (d.device_type == kDLCPU) return devices & SIEVE_DEVICE_CPU;
  if (d.device_type == kDLCUDA) return devices & SIEVE_DEVICE_CUDA;
  return false;
}

std::string geometry_device_name(DLDevice d) {
  if (d.device_type == kDLCPU) return "cpu";
  if (d.device_type == kDLCUDA) return "cuda";
  return "device type " + std::to_string(int(d.device_type));
}

std::string geometry_dtype_name(DLDataType t) {
  uint32_t b = dtype_bit(t);
  return b ? dtype_names(b) : "dtype(code " + std::to_string(t.code) + ", " +
                                  std::to_string(t.bits) + " bits)";
}

bool listed(const int32_t* values, uint32_t n, int32_t v) {
  if (n == 0) return true;  // "any"
  for (uint32_t i = 0; i < n; ++i)
    if (values[i] == v) return true;
  return false;
}

std::string list_text(const int32_t* values, uint32_t n) {
  std::string out;
  for (uint32_t i = 0; i < n; ++i) {
    if (i) out += ",";
    out += std::to_string(values[i]);
  }
  return out;
}

// The spec's store (default "paged") and its parameters; false after appending every problem.
bool resolve_store(const ChainSpec& spec, const Registry& registry, const sieve_geometry& g, ResolvedStore* out,
                   std::vector<std::string>* errors) {
  const std::string name = spec.kv_store ? spec.kv_store->plugin : "paged";
  const std::string where = spec.kv_store ? spec.kv_store->where + ": " : "";
  const StoreEntry* e = registry.find_store(name);
  if (!e) {
    std::vector<std::string> names;
    std::string avail;
    for (const auto& st : registry.stores()) {
      names.push_back(st.name);
      avail += (avail.empty() ? "" : ", ") + st.name;
    }
    std::string line = where + "unknown KV store '" + name + "'";
    if (std::string near = closest_name(name, names); !near.empty()) line += " (did you mean '" + near + "'?)";
    errors->push_back(line + "; available: " + (avail.empty() ? "none" : avail));
    return false;
  }
  const size_t before = errors->size();
  ResolvedStore rs;
  rs.entry = *e;
  parse_params(e->params(), spec.kv_store ? spec.kv_store->params : ParamPairs{}, &rs.values, errors,
               "KV store '" + name + "'");
  const sieve_kv_store_descriptor& d = e->descriptor;
  const std::string who = where + "KV store '" + name + "'";
  if (d.devices && !device_supported(d.devices, g.device))
    errors->push_back(who + " runs on " + device_names(d.devices) + ", not " + geometry_device_name(g.device));
  if (d.dtypes && !(d.dtypes & dtype_bit(g.kv_dtype)))
    errors->push_back(who + " stores " + dtype_names(d.dtypes) + ", not " + geometry_dtype_name(g.kv_dtype));
  if (d.n_page_sizes && d.page_sizes && !listed(d.page_sizes, d.n_page_sizes, g.page_size))
    errors->push_back(who + " takes page sizes " + list_text(d.page_sizes, d.n_page_sizes) + ", not " +
                      std::to_string(g.page_size));
  if (errors->size() != before) return false;
  *out = std::move(rs);
  return true;
}

}  // namespace

std::vector<std::string> chain_hook_conflicts(
    const std::array<std::vector<std::vector<size_t>>, 2>& chains, const std::vector<InstanceRole>& roles) {
  // (phase, message) -> layers, so that a chain used on many layers gives one line.
  std::map<std::pair<int, std::string>, std::vector<int32_t>> found;
  for (int ph = 0; ph < 2; ++ph)
    for (size_t l = 0; l < chains[ph].size(); ++l) {
      std::string attenders, observers;
      size_t n_attenders = 0;
      for (size_t inst : chains[ph][l]) {
        const InstanceRole& r = roles[inst];
        if (r.hooks & SIEVE_HOOK_ATTEND) {
          attenders += (n_attenders++ ? ", " : "") + r.label;
        }
        if (r.needs_stats && (r.hooks & SIEVE_HOOK_OBSERVE))
          observers += (observers.empty() ? "" : ", ") + r.label;
      }
      if (n_attenders > 1)
        found[{ph, "more than one policy implements attend (" + attenders +
                       "); a chain may replace the core kernel only once"}]
            .push_back(int32_t(l));
      else if (n_attenders == 1 && !observers.empty())
        found[{ph, observers + " asks for page statistics, which the core kernel computes, but " +
                       attenders + " replaces it (attend)"}]
            .push_back(int32_t(l));
    }
  std::vector<std::string> out;
  for (const auto& [key, layers] : found)
    out.push_back("layers " + ranges_text(layers) + " (" +
                  phase_label(key.first == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE) + "): " + key.second);
  return out;
}

bool resolve_chains(const ChainSpec& spec, const Registry& registry, const sieve_geometry& geometry,
                    ResolvedChains* out, std::vector<std::string>* errors) {
  const size_t errors_before = errors->size();
  const int32_t n_layers = geometry.n_layers;
  if (n_layers <= 0) {
    errors->push_back("model geometry: n_layers is " + std::to_string(n_layers));
    return false;
  }
  const auto& instances = spec.instances;

  // 1. Each instance: its plugin and its parameters.
  std::vector<const LoadedPlugin*> plugin(instances.size(), nullptr);
  std::vector<ParamValues> values(instances.size());
  std::vector<bool> usable(instances.size(), false);
  for (size_t i = 0; i < instances.size(); ++i) {
    const auto& inst = instances[i];
    const LoadedPlugin* p = registry.find(inst.plugin);
    if (!p || !p->policy()) {
      std::vector<std::string> policies;
      for (const auto& q : registry.plugins())
        if (q.policy()) policies.push_back(q.name());
      std::string line = inst.where + ": ";
      if (p) {
        line += "'" + inst.plugin + "' is a KV-store plugin, not an attention policy";
      } else {
        line += "unknown policy '" + inst.plugin + "'";
        std::string near = closest_name(inst.plugin, policies);
        if (!near.empty()) line += " (did you mean '" + near + "'?)";
      }
      std::string avail;
      for (const auto& n : policies) {
        if (!avail.empty()) avail += ", ";
        avail += n;
      }
      line += avail.empty() ? "; no policy plugins are loaded" : "; available: " + avail;
      // The policy may be in one of the files that did not load: say which and why.
      if (!p && !registry.failures().empty()) {
        line += "; plugin files not loaded:";
        for (const auto& f : registry.failures()) line += " [" + f.reason + "]";
      }
      errors->push_back(line);
      continue;
    }
    plugin[i] = p;
    usable[i] = parse_params(ParamSchema::of(*p->policy()), inst.params, &values[i], errors,
                             inst.label());
  }

  // 2. Each rule: its layers exist, its phases are ones every policy of its chain runs in, and
  //    no instance appears twice in its chain. Then it overrides earlier rules.
  std::array<std::vector<std::vector<size_t>>, 2> table;
  for (auto& t : table) t.assign(size_t(n_layers), {});
  for (size_t k = 0; k < spec.rules.size(); ++k) {
    const ChainRule& r = spec.rules[k];
    const std::string model = "the model has " + std::to_string(n_layers) + " layers (0-" +
                              std::to_string(n_layers - 1) + ")";
    std::vector<int32_t> layers;
    bool layers_ok = true;
    if (r.all_layers) {
      for (int32_t l = 0; l < n_layers; ++l) layers.push_back(l);
    } else {
      for (const auto& range : r.layers) {
        int32_t last = range.last < 0 ? n_layers - 1 : range.last;
        if (range.first >= n_layers || last >= n_layers) {
          errors->push_back(range.where + ": layer " +
                            std::to_string(range.first >= n_layers ? range.first : last) +
                            " does not exist: " + model);
          layers_ok = false;
          continue;
        }
        for (int32_t l = range.first; l <= last; ++l) layers.push_back(l);
      }
    }
    std::set<size_t> in_chain;
    for (size_t inst : r.chain) {
      if (!in_chain.insert(inst).second)
        errors->push_back(r.where + ": instance " + instances[inst].label() +
                          " appears twice in one chain");
      if (!plugin[inst]) continue;
      const uint32_t declared = plugin[inst]->descriptor()->phases;
      if (r.phases & ~declared) {
        std::string fix = (declared & (SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE)) ==
                                  (SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE)
                              ? ""
                              : " (write '" + phase_names(declared) + ":' before the layers)";
        errors->push_back(instances[inst].where + ": policy '" + instances[inst].plugin +
                          "' runs in " + phase_names(declared) + " only, the rule asks for " +
                          phase_names(r.phases) + fix);
      }
    }
    if (!layers_ok) continue;
    for (uint32_t phase : {uint32_t(SIEVE_PHASE_PREFILL), uint32_t(SIEVE_PHASE_DECODE)}) {
      if (!(r.phases & phase)) continue;
      for (int32_t l : layers) table[ResolvedChains::phase_index(phase)][l] = r.chain;
    }
  }

  // 3. At most one `attend` per (layer, phase), and no statistics where it is replaced. A table
  //    that answers instance_hooks says its hooks only after create: the layer runner checks it.
  std::vector<InstanceRole> roles(instances.size());
  for (size_t i = 0; i < instances.size(); ++i) {
    roles[i].label = instances[i].label();
    if (!plugin[i]) continue;
    const sieve_policy_api& api = *plugin[i]->policy();
    roles[i].hooks = hooks_per_instance(api) ? 0 : table_hooks(api);
    roles[i].needs_stats = (plugin[i]->descriptor()->needs & SIEVE_NEEDS_PAGE_STATS) != 0;
  }
  for (auto& line : chain_hook_conflicts(table, roles)) errors->push_back(std::move(line));

  // 4. What each instance serves after the overrides; instances that serve nothing are dropped.
  std::vector<uint32_t> phases(instances.size(), 0);
  std::vector<std::set<int32_t>> served(instances.size());
  for (int ph = 0; ph < 2; ++ph)
    for (int32_t l = 0; l < n_layers; ++l)
      for (size_t inst : table[ph][l]) {
        phases[inst] |= ph == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
        served[inst].insert(l);
      }

  // 5. Declared capabilities against the geometry, then the policy's own validate().
  std::vector<std::string> unused;  // told only when the spec resolves: an error explains itself
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!plugin[i] || !usable[i]) continue;
    if (!phases[i]) {
      unused.push_back(instances[i].label());
      continue;
    }
    const auto& d = *plugin[i]->descriptor();
    const std::string who = instances[i].label() + ": ";
    const size_t before = errors->size();
    if (!device_supported(d.devices, geometry.device))
      errors->push_back(who + "runs on " + device_names(d.devices) + ", the model runs on " +
                        geometry_device_name(geometry.device));
    if (!(dtype_bit(geometry.kv_dtype) & d.dtypes))
      errors->push_back(who + "supports KV dtypes " + dtype_names(d.dtypes) + ", the model's is " +
                        geometry_dtype_name(geometry.kv_dtype));
    if (!listed(d.head_dims, d.n_head_dims, geometry.head_dim))
      errors->push_back(who + "supports head dims " + list_text(d.head_dims, d.n_head_dims) +
                        ", the model's is " + std::to_string(geometry.head_dim));
    if (!listed(d.page_sizes, d.n_page_sizes, geometry.page_size))
      errors->push_back(who + "supports page sizes " + list_text(d.page_sizes, d.n_page_sizes) +
                        ", the model's is " + std::to_string(geometry.page_size));
    if (errors->size() != before) continue;  // validate() would only repeat the mismatch

    std::vector<std::string> reasons;
    sieve_reason_sink sink{&reasons, [](void* ctx, const char* msg) {
                             static_cast<std::vector<std::string>*>(ctx)->push_back(
                                 msg ? msg : "(null reason)");
                           }};
    const sieve_status st =
        plugin[i]->policy()->validate(&geometry, values[i].data(), values[i].size(), sink);
    if (st != SIEVE_OK) {
      if (reasons.empty())
        errors->push_back(who + "validate() returned " + status_name(st) + " without a reason");
      for (const auto& r : reasons) errors->push_back(who + r);
    } else {
      for (const auto& r : reasons) spdlog::warn("{}{} (validate() accepted the geometry)", who, r);
    }
  }
  ResolvedStore store;
  resolve_store(spec, registry, geometry, &store, errors);
  if (errors->size() != errors_before) return false;
  for (const auto& label : unused)
    spdlog::info("chain: {} serves no layer (unused, or overridden by later rules); not created", label);

  // 6. The resolved chains, with instances renumbered to the ones that serve something.
  ResolvedChains rc;
  rc.n_layers = n_layers;
  rc.store = std::move(store);
  std::vector<size_t> remap(instances.size(), SIZE_MAX);
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!phases[i]) continue;
    remap[i] = rc.instances.size();
    ResolvedInstance ri;
    ri.label = instances[i].label();
    ri.plugin = *plugin[i];
    ri.values = values[i];
    ri.phases = phases[i];
    ri.layers.assign(served[i].begin(), served[i].end());
    rc.needs |= plugin[i]->descriptor()->needs;
    rc.instances.push_back(std::move(ri));
  }
  for (int ph = 0; ph < 2; ++ph) {
    rc.chains[ph].resize(size_t(n_layers));
    rc.graph_level[ph].assign(size_t(n_layers), SIEVE_CUDA_GRAPH_FULL);
    for (int32_t l = 0; l < n_layers; ++l)
      for (size_t inst : table[ph][l]) {
        rc.chains[ph][l].push_back(remap[inst]);
        rc.graph_level[ph][l] =
            std::min(rc.graph_level[ph][l], plugin[inst]->descriptor()->cuda_graph);
      }
  }
  *out = std::move(rc);
  return true;
}

}  // namespace sieve::runtime
