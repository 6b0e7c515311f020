// Chain specs: the compact and file forms (grammar in chain_spec.hpp), and their resolution
// against the registry and a model's geometry.
#include "sieve/runtime/chain_spec.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/printable.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/status.hpp"

namespace sieve::runtime {

namespace {

bool is_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }
bool is_id_char(char c) { return is_name_char(c) || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
// What a bare (unquoted, unbracketed) parameter value may hold; to_string() quotes any other.
bool is_bare_value_char(char c) {
  return !(c == ',' || c == '(' || c == ')' || c == '[' || c == ']' || c == '"' || is_space(c) || c == ';' ||
           c == '>');
}

// One parser over one text (the whole compact spec, or one line of a file). Instances with an id
// are shared through `ids` across all the texts of one spec.
class Parser {
 public:
  Parser(const std::string& text, std::string source, ChainSpec* spec,
         std::map<std::string, size_t>* ids)
      : s_(text), source_(std::move(source)), spec_(spec), ids_(ids) {}

  const std::string& error() const { return error_; }

  // spec := rule (';' rule)*   (a trailing ';' is allowed)
  bool parse_rules() {
    skip_ws();
    if (at_end()) return fail(pos_, "empty chain spec");
    for (;;) {
      if (!parse_rule()) return false;
      skip_ws();
      if (at_end()) return true;
      if (peek() != ';')
        return fail(pos_, "expected '>' or ';' after " + last_item_ + ", found " + found());
      ++pos_;
      skip_ws();
      if (at_end()) return true;
    }
  }

  // A file's declaration line: name@id(params), nothing else.
  bool parse_declaration() {
    skip_ws();
    size_t start = pos_;
    size_t inst;
    if (!parse_item(&inst)) return false;
    if (spec_->instances[inst].id.empty())
      return fail(start, "a line without '=' declares an instance and needs an id: name@id(...)");
    skip_ws();
    if (!at_end()) return fail(pos_, "unexpected " + found() + " after the declaration");
    return true;
  }

  std::string where(size_t at) const { return source_ + ", col " + std::to_string(at + 1); }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_ws() {
    while (!at_end() && is_space(s_[pos_])) ++pos_;
  }
  std::string found() const {
    if (at_end()) return "the end";
    const size_t n = std::max<size_t>(1, detail::utf8_sequence(s_, pos_));  // all of a 'Δ'
    return "'" + printable(std::string_view(s_).substr(pos_, n)) + "'";
  }
  bool fail(size_t at, const std::string& msg) {
    error_ = where(at) + ": " + msg;
    return false;
  }
  std::string read_while(bool (*pred)(char)) {
    size_t b = pos_;
    while (!at_end() && pred(s_[pos_])) ++pos_;
    return s_.substr(b, pos_ - b);
  }

  bool parse_number(int32_t* v) {
    size_t b = pos_;
    std::string digits = read_while(is_digit);
    if (digits.empty()) return false;
    if (digits.size() > 9) return fail(b, "layer number " + digits + " is too large");
    *v = std::stoi(digits);
    return true;
  }

  // rule := [phase ':'] layers '=' chain
  bool parse_rule() {
    ChainRule rule;
    skip_ws();
    rule.where = where(pos_);
    if (std::isalpha(static_cast<unsigned char>(peek()))) {
      size_t b = pos_;
      std::string word = read_while(is_id_char);
      skip_ws();
      if (peek() != ':')
        return fail(b, "expected layers ('*', N, N-M or N-) or a phase ('prefill:' or 'decode:'), "
                       "found '" + word + "'");
      if (word == "prefill") rule.phases = SIEVE_PHASE_PREFILL;
      else if (word == "decode") rule.phases = SIEVE_PHASE_DECODE;
      else return fail(b, "unknown phase '" + word + "' (expected prefill or decode)");
      ++pos_;
      skip_ws();
    }
    if (peek() == '*') {
      rule.all_layers = true;
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        size_t b = pos_;
        LayerRange r;
        r.where = where(b);
        if (!parse_number(&r.first)) {
          if (!error_.empty()) return false;
          return fail(pos_, "expected layers ('*', N, N-M or N-), found " + found());
        }
        r.last = r.first;
        if (peek() == '-') {
          ++pos_;
          if (is_digit(peek())) {
            if (!parse_number(&r.last)) return false;
            if (r.last < r.first)
              return fail(b, "empty layer range " + std::to_string(r.first) + "-" +
                                 std::to_string(r.last));
          } else {
            r.last = -1;  // N-: to the last layer
          }
        }
        rule.layers.push_back(r);
        skip_ws();
        if (peek() != ',') break;
        ++pos_;
      }
    }
    skip_ws();
    if (peek() != '=') return fail(pos_, "expected '=' after layers, found " + found());
    ++pos_;
    // chain := item ('>' item)*
    for (;;) {
      size_t inst;
      if (!parse_item(&inst)) return false;
      rule.chain.push_back(inst);
      skip_ws();
      if (peek() != '>') break;
      ++pos_;
    }
    spec_->rules.push_back(std::move(rule));
    return true;
  }

  // item := name ['@' id] ['(' key=value (',' key=value)* ')']
  bool parse_item(size_t* index) {
    skip_ws();
    const size_t start = pos_;
    ChainInstance inst;
    inst.where = where(start);
    inst.plugin = read_while(is_name_char);
    if (inst.plugin.empty())
      return fail(pos_, "expected a policy name ([a-z0-9_]+), found " + found());
    if (is_id_char(peek()))
      return fail(pos_, "policy names are [a-z0-9_]+, found " + found());
    if (peek() == '@') {
      ++pos_;
      inst.id = read_while(is_id_char);
      if (inst.id.empty())
        return fail(pos_, "expected an instance id ([A-Za-z0-9_]+) after '@', found " + found());
    }
    skip_ws();
    if (peek() == '(') {
      ++pos_;
      skip_ws();
      if (peek() == ')') {
        ++pos_;
      } else {
        for (;;) {
          skip_ws();
          std::string key = read_while(is_name_char);
          if (key.empty())
            return fail(pos_, "expected a parameter name ([a-z0-9_]+), found " + found());
          skip_ws();
          if (peek() != '=')
            return fail(pos_, "expected '=' after parameter '" + key + "', found " + found());
          ++pos_;
          skip_ws();
          std::string value;
          if (!parse_value(key, &value)) return false;
          inst.params.emplace_back(key, value);
          skip_ws();
          if (peek() == ',') { ++pos_; continue; }
          if (peek() == ')') { ++pos_; break; }
          return fail(pos_, "expected ',' or ')' in the parameters of '" + inst.plugin +
                                "', found " + found());
        }
        inst.params_given = true;
      }
    }
    last_item_ = "'" + inst.label() + "'";
    if (inst.id.empty()) {
      spec_->instances.push_back(std::move(inst));
      *index = spec_->instances.size() - 1;
      return true;
    }
    auto it = ids_->find(inst.id);
    if (it == ids_->end()) {
      spec_->instances.push_back(std::move(inst));
      *index = spec_->instances.size() - 1;
      (*ids_)[spec_->instances.back().id] = *index;
      return true;
    }
    ChainInstance& prev = spec_->instances[it->second];
    if (prev.plugin != inst.plugin)
      return fail(start, "instance @" + inst.id + " is '" + prev.plugin + "' at " + prev.where +
                             ", here '" + inst.plugin + "'");
    if (inst.params_given) {
      if (prev.params_given)
        return fail(start, "parameters of " + inst.label() + " are given twice (also at " +
                               prev.where + ")");
      prev.params = std::move(inst.params);
      prev.params_given = true;
    }
    *index = it->second;
    return true;
  }

  // value := '"' [^"]* '"' | '[' [^\]]* ']' | bare
  bool parse_value(const std::string& key, std::string* value) {
    const size_t b = pos_;
    if (peek() == '"') {
      size_t close = s_.find('"', pos_ + 1);
      if (close == std::string::npos) return fail(b, "unterminated string for '" + key + "'");
      *value = s_.substr(pos_ + 1, close - pos_ - 1);
      pos_ = close + 1;
      return true;
    }
    if (peek() == '[') {
      size_t close = s_.find(']', pos_ + 1);
      if (close == std::string::npos) return fail(b, "missing ']' in the list for '" + key + "'");
      *value = s_.substr(pos_, close - pos_ + 1);
      pos_ = close + 1;
      return true;
    }
    *value = read_while(is_bare_value_char);
    if (value->empty()) return fail(pos_, "expected a value for '" + key + "', found " + found());
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::string source_;
  ChainSpec* spec_;
  std::map<std::string, size_t>* ids_;
  std::string error_;
  std::string last_item_;
};

// Strip a '#' comment that is not inside quotes.
std::string strip_comment(const std::string& line) {
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') quoted = !quoted;
    else if (line[i] == '#' && !quoted) return line.substr(0, i);
  }
  return line;
}

// A declaration line has no '=' outside parentheses, brackets and quotes, and starts with an item
// (a name followed by '@' or '('); anything else is parsed as rules, whose errors then explain.
bool is_declaration_line(const std::string& line) {
  int depth = 0;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    if (quoted) continue;
    if (c == '(' || c == '[') ++depth;
    else if (c == ')' || c == ']') --depth;
    else if (c == '=' && depth == 0) return false;
  }
  size_t i = line.find_first_not_of(" \t");
  size_t n = i;
  while (n < line.size() && is_name_char(line[n])) ++n;
  if (n == i) return false;
  while (n < line.size() && (line[n] == ' ' || line[n] == '\t')) ++n;
  return n == line.size() || line[n] == '@' || line[n] == '(';
}

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

}  // namespace

bool parse_chain_spec(const std::string& text, ChainSpec* out, std::string* error) {
  ChainSpec spec;
  std::map<std::string, size_t> ids;
  Parser p(text, "chain spec", &spec, &ids);
  if (!p.parse_rules()) {
    *error = p.error();
    return false;
  }
  *out = std::move(spec);
  return true;
}

bool parse_chain_file(const std::string& text, const std::string& source, ChainSpec* out,
                      std::string* error) {
  ChainSpec spec;
  std::map<std::string, size_t> ids;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = strip_comment(line);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Parser p(line, source + ":" + std::to_string(n), &spec, &ids);
    if (!(is_declaration_line(line) ? p.parse_declaration() : p.parse_rules())) {
      *error = p.error();
      return false;
    }
  }
  if (spec.rules.empty()) {
    *error = source + ": no chain rules (a rule looks like 'decode:0-4=quest')";
    return false;
  }
  *out = std::move(spec);
  return true;
}

bool parse_chain_argument(const std::string& text, ChainSpec* out, std::string* error) {
  const size_t eq = text.find('='), paren = text.find('(');
  const bool bare = eq == std::string::npos || (paren != std::string::npos && eq > paren);
  return parse_chain_spec(bare ? "*=" + text : text, out, error);
}

bool load_chain_file(const std::string& path, ChainSpec* out, std::string* error) {
  std::string text;
  try {  // a regular file of at most 1 MiB (a FIFO would block, /dev/zero never end)
    text = read_text_file(path, "chain file", 1 << 20);
  } catch (const Error& e) {
    *error = e.what();
    return false;
  }
  return parse_chain_file(text, printable(path), out, error);
}

std::string to_string(const ChainSpec& spec) {
  std::string out;
  std::set<size_t> printed;  // an instance's parameters are written once, at its first item
  for (const auto& r : spec.rules) {
    if (!out.empty()) out += "; ";
    if (r.phases == SIEVE_PHASE_PREFILL) out += "prefill:";
    if (r.phases == SIEVE_PHASE_DECODE) out += "decode:";
    if (r.all_layers) {
      out += "*";
    } else {
      for (size_t i = 0; i < r.layers.size(); ++i) {
        const auto& l = r.layers[i];
        if (i) out += ",";
        out += std::to_string(l.first);
        if (l.last < 0) out += "-";
        else if (l.last != l.first) {
          out += "-";
          out += std::to_string(l.last);
        }
      }
    }
    out += "=";
    for (size_t k = 0; k < r.chain.size(); ++k) {
      const auto& inst = spec.instances[r.chain[k]];
      if (k) out += ">";
      out += inst.label();
      if (inst.params_given && printed.insert(r.chain[k]).second) {
        out += "(";
        for (size_t i = 0; i < inst.params.size(); ++i) {
          const auto& v = inst.params[i].second;
          // Written as it was read: a list as one '[...]' (its only ']' last), else bare when
          // every character may be bare, else quoted (a value read from quotes holds no '"').
          const bool list = !v.empty() && v.front() == '[' && v.find(']') == v.size() - 1;
          const bool quote = !list && (v.empty() || !std::all_of(v.begin(), v.end(), is_bare_value_char));
          if (i) out += ",";
          out += inst.params[i].first + "=" + (quote ? "\"" + v + "\"" : v);
        }
        out += ")";
      }
    }
  }
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

  // 3. At most one `attend` per (layer, phase); one line per offending chain, naming its layers.
  std::map<std::pair<int, std::string>, std::vector<int32_t>> attend_conflicts;
  for (int ph = 0; ph < 2; ++ph)
    for (int32_t l = 0; l < n_layers; ++l) {
      std::vector<std::string> attenders;
      for (size_t inst : table[ph][l])
        if (plugin[inst] && plugin[inst]->policy()->attend)
          attenders.push_back(instances[inst].label());
      if (attenders.size() > 1) {
        std::string names;
        for (auto& a : attenders) {
          if (!names.empty()) names += ", ";
          names += a;
        }
        attend_conflicts[{ph, names}].push_back(l);
      }
    }
  for (const auto& [key, layers] : attend_conflicts)
    errors->push_back("layers " + ranges_text(layers) + " (" +
                      phase_label(key.first == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE) +
                      "): more than one policy implements attend (" + key.second +
                      "); a chain may replace the core kernel only once");

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
  if (errors->size() != errors_before) return false;
  for (const auto& label : unused)
    spdlog::info("chain: {} serves no layer (unused, or overridden by later rules); not created", label);

  // 6. The resolved chains, with instances renumbered to the ones that serve something.
  ResolvedChains rc;
  rc.n_layers = n_layers;
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
