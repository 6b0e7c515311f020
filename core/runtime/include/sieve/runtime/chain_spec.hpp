// Chain specs: which policy instances run, in which order, for which layers and phases.
//
// ---- Compact form (command line: --chain '...') ---------------------------------------------
//   spec   := rule (';' rule)*
//   rule   := [phase ':'] layers '=' chain
//   phase  := 'prefill' | 'decode'                  omitted: both phases
//   layers := '*' | range (',' range)*              '*': every layer of the model
//   range  := N | N '-' M | N '-'                   N-: layer N to the last layer; 0-based
//   chain  := item ('>' item)*                      chain order = call order (policy.h)
//   item   := name ['@' id] ['(' param (',' param)* ')']
//   param  := key '=' value
//   value  := bare | '[' ... ']' | '"' ... '"'      int lists in brackets: [2,14,22]
//   or, once, in place of a rule:
//   store  := 'kv_store' '=' name ['(' param (',' param)* ')']   the session's KV store
// Names and keys are [a-z0-9_]+, ids [A-Za-z0-9_]+; spaces around tokens are ignored.
// Parameter values use the syntax of params.hpp.
//
// Instances. Items that carry the same @id anywhere in the spec are ONE policy instance: it
// serves every layer and phase of every rule naming it (DELTA keeps its selection across the
// layers of a step this way); its parameters may be written at only one of its items. An item
// without an id is its own instance, serving all the layers of its rule.
//
// Overrides. Rules apply in order; for every (layer, phase) a rule names, it replaces the chain
// an earlier rule gave. A (layer, phase) no rule names has an empty chain: dense core attention.
//
// Examples:
//   decode:*=quest(page_budget=64)
//   decode:0-1=dense; decode:2-=delta@d(delta_layers=[2,14,22])>raas(budget=1024)
//   prefill:*=dpxa(threshold=0.9)>delta_correction@c(gamma=16); decode:*=quest
//   kv_store=paged; decode:*=quest             (no kv_store: the core's "paged" store)
//
// ---- File form (--chain-file PATH) ----------------------------------------------------------
// One rule per line (or several separated by ';'), same grammar. '#' starts a comment (outside
// quotes), blank lines are ignored, and a line of the form  name@id(params)  alone (no '=')
// declares an instance that rules then name by  name@id :
//   # DELTA shared by all decode layers from 2 on
//   delta@d(delta_layers=[2,14,22], recent=64)
//   decode:2-=delta@d>quest(page_budget=32)
//
// Errors are one line with the position: "chain spec, col 17: expected '=' after layers",
// "chains.txt:3, col 5: ...".
#pragma once

#include <sieve/abi.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"

namespace sieve::runtime {

struct ChainInstance {
  std::string plugin;    // policy name
  std::string id;        // "" for an anonymous instance
  ParamPairs params;     // raw key=value as written
  bool params_given = false;
  std::string where;     // where it was (first) written, for messages: "col 12" / "file:3, col 5"
  std::string label() const { return id.empty() ? plugin : plugin + "@" + id; }
};

struct LayerRange {
  int32_t first = 0;
  int32_t last = -1;  // inclusive; -1: to the model's last layer
  std::string where;
};

struct ChainRule {
  uint32_t phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE;
  bool all_layers = false;         // '*'
  std::vector<LayerRange> layers;  // when !all_layers
  std::vector<size_t> chain;       // indices into ChainSpec::instances, in call order
  std::string where;
};

struct ChainSpec {
  std::vector<ChainInstance> instances;
  std::vector<ChainRule> rules;
  std::optional<ChainInstance> kv_store;  // the store named by a kv_store element (plugin = its name)
  bool empty() const { return rules.empty(); }
};

// Parse the compact form. On failure *error is one line ("chain spec, col N: ...").
bool parse_chain_spec(const std::string& text, ChainSpec* out, std::string* error);
// A chain as a user writes it on a command line: a bare chain without layers
// ("streaming(window=64)", "quest>dense") means every layer ("*=..."); otherwise parse_chain_spec.
bool parse_chain_argument(const std::string& text, ChainSpec* out, std::string* error);
// A store as `--kv-store` takes it: NAME or NAME(k=v,...) (the item grammar, no @id).
bool parse_store_argument(const std::string& text, ChainInstance* out, std::string* error);
// Names `store` as spec's KV store; false with one line when the spec already names one.
bool set_kv_store(ChainSpec* spec, const ChainInstance& store, std::string* error);
// parse_store_argument + set_kv_store: what a host's `--kv-store TEXT` does to a chain ("" : nothing).
bool apply_store_argument(const std::string& text, ChainSpec* spec, std::string* error);
// Parse the file form; `source` names the file in messages.
bool parse_chain_file(const std::string& text, const std::string& source, ChainSpec* out,
                      std::string* error);
// Read and parse a chain file.
bool load_chain_file(const std::string& path, ChainSpec* out, std::string* error);

// The spec written back in compact form (normalised), for logs and reports.
std::string to_string(const ChainSpec& spec);

// ---- Resolution against the loaded plugins and a model ---------------------------------------

struct ResolvedInstance {
  std::string label;       // "quest@q" or "quest"
  LoadedPlugin plugin;     // shares the library: keeps it loaded while the chain exists
  ParamValues values;      // validated, schema order, defaults filled
  uint32_t phases = 0;     // phases it serves
  std::vector<int32_t> layers;  // layers it serves (any phase), ascending
  const sieve_policy_api& api() const { return *plugin.policy(); }
  const sieve_policy_descriptor& descriptor() const { return *plugin.descriptor(); }
};

// The KV store a spec chose (its kv_store element, else the core's "paged"), with its
// parameters validated against the store's schema.
struct ResolvedStore {
  StoreEntry entry;    // entry.api == nullptr: none resolved (a Session then uses "paged")
  ParamValues values;  // schema order, defaults filled
};

struct ResolvedChains {
  int32_t n_layers = 0;
  ResolvedStore store;
  std::vector<ResolvedInstance> instances;  // only instances that serve some (layer, phase)
  // chains[phase_index][layer]: instance indices in call order; phase_index 0 prefill, 1 decode.
  std::array<std::vector<std::vector<size_t>>, 2> chains;
  // Effective CUDA-graph level per phase and layer: the minimum over the chain's descriptors.
  // An empty chain runs only the core kernel and is reported as SIEVE_CUDA_GRAPH_FULL.
  std::array<std::vector<uint32_t>, 2> graph_level;
  uint32_t needs = 0;  // OR of every instance's descriptor needs (store/host setup)

  static int phase_index(uint32_t phase) { return phase == SIEVE_PHASE_PREFILL ? 0 : 1; }
  const std::vector<size_t>& chain(int32_t layer, uint32_t phase) const {
    return chains[phase_index(phase)][layer];
  }
  uint32_t cuda_graph_level(int32_t layer, uint32_t phase) const {
    return graph_level[phase_index(phase)][layer];
  }
};

// Check a parsed spec against the registry and the model geometry (n_layers from
// geometry.n_layers): unknown policy (listing the available ones), parameters against the
// schema, declared phases cover the rule's phases, layers exist, declared devices / dtypes /
// head dims / page sizes fit the geometry, the policy's validate() (every reason, prefixed with
// the instance), at most one `attend` per (layer, phase), an instance at most once per chain;
// the KV store: a known name (listing the stores), its parameters against its schema, the
// geometry's device / dtype / page size among those its descriptor declares.
// Every problem is appended to *errors (one line each); true when there were none.
bool resolve_chains(const ChainSpec& spec, const Registry& registry, const sieve_geometry& geometry,
                    ResolvedChains* out, std::vector<std::string>* errors);

// What the chain checks need of one instance: its label, the hooks it uses (sieve_hook_bits) and
// whether its descriptor asks for page statistics (SIEVE_NEEDS_PAGE_STATS).
struct InstanceRole {
  std::string label;
  uint32_t hooks = 0;
  bool needs_stats = false;
};

// One line per (phase, chain) that replaces the core kernel twice (two instances using attend),
// and one per (phase, chain) where an instance that needs page statistics and observes shares the
// chain with one that replaces the core kernel (which is what computes them); each line names the
// chain's layers. chains[phase_index][layer] holds indices into `roles`. resolve_chains checks the
// hooks known before create (tables without instance_hooks); the layer runner checks again with
// every instance's own hooks once they are created.
std::vector<std::string> chain_hook_conflicts(
    const std::array<std::vector<std::vector<size_t>>, 2>& chains, const std::vector<InstanceRole>& roles);

}  // namespace sieve::runtime
