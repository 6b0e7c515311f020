// Chain specs as text: the compact and file forms (grammar in chain_spec.hpp), the kv_store
// element, and the spec written back. Resolution against plugins and a model: chain_spec.cpp.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/printable.hpp"

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
        return fail(pos_, std::string(last_was_store_ ? "expected ';'" : "expected '>' or ';'") + " after " +
                              last_item_ + ", found " + found());
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

  bool expect_end() {
    skip_ws();
    return at_end() || fail(pos_, "unexpected " + found() + " after " + last_item_);
  }

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
      if (word == "kv_store" && peek() == '=') {  // kv_store = NAME(k=v,...): the session's store
        ++pos_;
        return parse_store(b);
      }
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

  // The store item of a kv_store element (the keyword and '=' are read): one per spec, no @id.
  bool parse_store(size_t keyword_at) {
    if (spec_->kv_store)
      return fail(keyword_at, "the KV store is named twice (also at " + spec_->kv_store->where + ")");
    ChainInstance inst;
    if (!read_store_item(&inst)) return false;
    spec_->kv_store = std::move(inst);
    return true;
  }

 public:
  // store := name ['(' key=value (',' key=value)* ')'], nothing after it but a ';' or the end.
  bool read_store_item(ChainInstance* inst) {
    skip_ws();
    const size_t start = pos_;
    if (!read_item(inst, "KV store")) return false;
    if (!inst->id.empty()) return fail(start, "a KV store takes no @id ('" + inst->label() + "')");
    last_item_ = "KV store '" + inst->plugin + "'";
    last_was_store_ = true;
    return true;
  }

 private:
  // item := name ['@' id] ['(' key=value (',' key=value)* ')']
  bool parse_item(size_t* index) {
    skip_ws();
    const size_t start = pos_;
    ChainInstance inst;
    if (!read_item(&inst, "policy")) return false;
    last_item_ = "'" + inst.label() + "'";
    last_was_store_ = false;
    return add_instance(std::move(inst), start, index);
  }

  bool read_item(ChainInstance* out, const char* what) {
    skip_ws();
    const size_t start = pos_;
    ChainInstance& inst = *out;
    inst.where = where(start);
    inst.plugin = read_while(is_name_char);
    if (inst.plugin.empty())
      return fail(pos_, std::string("expected a ") + what + " name ([a-z0-9_]+), found " + found());
    if (is_id_char(peek()))
      return fail(pos_, std::string(what) + " names are [a-z0-9_]+, found " + found());
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
    return true;
  }

  bool add_instance(ChainInstance inst, size_t start, size_t* index) {
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
  bool last_was_store_ = false;  // the last element read was a kv_store (no '>' may follow)
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

}  // namespace

bool set_kv_store(ChainSpec* spec, const ChainInstance& store, std::string* error) {
  if (spec->kv_store) {
    *error = "the KV store is named twice: '" + store.plugin + "' (" + store.where + ") and '" +
             spec->kv_store->plugin + "' (" + spec->kv_store->where + ")";
    return false;
  }
  spec->kv_store = store;
  return true;
}

bool apply_store_argument(const std::string& text, ChainSpec* spec, std::string* error) {
  if (text.empty()) return true;
  ChainInstance store;
  return parse_store_argument(text, &store, error) && set_kv_store(spec, store, error);
}

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
  if (spec.rules.empty() && !spec.kv_store) {
    *error = source + ": no chain rules (a rule looks like 'decode:0-4=quest')";
    return false;
  }
  *out = std::move(spec);
  return true;
}

bool parse_store_argument(const std::string& text, ChainInstance* out, std::string* error) {
  ChainSpec unused;
  std::map<std::string, size_t> ids;
  Parser p(text, "kv store", &unused, &ids);
  ChainInstance inst;
  if (!p.read_store_item(&inst) || !p.expect_end()) {
    *error = p.error();
    return false;
  }
  *out = std::move(inst);
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

namespace {
// name(k=v,...) as read: a list as one '[...]' (its only ']' last), else bare when every character
// may be bare, else quoted (a value read from quotes holds no '"').
std::string item_text(const ChainInstance& inst, bool with_params) {
  std::string out = inst.label();
  if (!with_params || !inst.params_given) return out;
  out += "(";
  for (size_t i = 0; i < inst.params.size(); ++i) {
    const auto& v = inst.params[i].second;
    const bool list = !v.empty() && v.front() == '[' && v.find(']') == v.size() - 1;
    const bool quote = !list && (v.empty() || !std::all_of(v.begin(), v.end(), is_bare_value_char));
    if (i) out += ",";
    out += inst.params[i].first + "=" + (quote ? "\"" + v + "\"" : v);
  }
  return out + ")";
}
}  // namespace

std::string to_string(const ChainSpec& spec) {
  std::string out;
  if (spec.kv_store) out = "kv_store=" + item_text(*spec.kv_store, true);
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
      if (k) out += ">";
      out += item_text(spec.instances[r.chain[k]], printed.insert(r.chain[k]).second);
    }
  }
  return out;
}

}  // namespace sieve::runtime
