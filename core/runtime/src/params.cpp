// Parameter parsing and schema checks (see params.hpp for the value syntax).
#include "sieve/runtime/params.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <cstdio>
#include <sstream>

#include "sieve/runtime/loader.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::runtime {

ParamSchema::ParamSchema(const sieve_param_spec* specs, uint32_t n)
    : base_(reinterpret_cast<const char*>(specs)), n_(specs ? n : 0) {
  // A later minor may have grown the struct: step by the size the plugin compiled.
  if (specs && specs[0].hdr.struct_size > sizeof(sieve_param_spec))
    stride_ = specs[0].hdr.struct_size;
}

int ParamSchema::find(const std::string& name) const {
  for (uint32_t i = 0; i < n_; ++i)
    if ((*this)[i].name && name == (*this)[i].name) return int(i);
  return -1;
}

void ParamValues::push(const sieve_param_value& v, std::string text, std::vector<int64_t> list) {
  values_.push_back(v);
  text_.push_back(std::move(text));
  lists_.push_back(std::move(list));
  relink();
}

void ParamValues::relink() {
  for (size_t i = 0; i < values_.size(); ++i) {
    auto& v = values_[i];
    v.s = (v.type == SIEVE_PARAM_STRING || v.type == SIEVE_PARAM_ENUM) ? text_[i].c_str() : nullptr;
    v.list = v.type == SIEVE_PARAM_INT_LIST ? lists_[i].data() : nullptr;
    v.list_len = v.type == SIEVE_PARAM_INT_LIST ? uint32_t(lists_[i].size()) : 0;
  }
}

const char* param_type_name(uint32_t type) {
  switch (type) {
    case SIEVE_PARAM_BOOL: return "bool";
    case SIEVE_PARAM_INT: return "int";
    case SIEVE_PARAM_FLOAT: return "float";
    case SIEVE_PARAM_STRING: return "string";
    case SIEVE_PARAM_ENUM: return "enum";
    case SIEVE_PARAM_INT_LIST: return "int_list";
    default: return "unknown";
  }
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// %g-style number without trailing noise ("4096", "0.5", "1e+30"). snprintf, not a stream: no
// C++ locale is touched, so an error message can be formatted inside any host process.
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.12g", x);
  return buf;
}

std::string range_text(const sieve_param_spec& s) {
  std::string r = "[";
  r += num(s.min);
  r += ", ";
  r += num(s.max);
  r += "]";
  return r;
}

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> out;
  if (!choices) return out;
  std::string c = choices;
  size_t start = 0;
  for (;;) {
    size_t bar = c.find('|', start);
    out.push_back(c.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

// strtoll/strtod skip leading white space ("\f90" read as 90): the text is trimmed of blanks
// already, anything else in front is not part of a number.
bool starts_a_number(const std::string& t) {
  return !t.empty() && !std::isspace(static_cast<unsigned char>(t.front()));
}

bool parse_int(const std::string& t, int64_t* v) {
  if (!starts_a_number(t)) return false;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(t.c_str(), &end, 10);
  if (errno == ERANGE || end != t.c_str() + t.size()) return false;
  *v = x;
  return true;
}

bool parse_float(const std::string& t, double* v) {
  if (!starts_a_number(t)) return false;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(t.c_str(), &end);
  if (errno == ERANGE || end != t.c_str() + t.size() || !std::isfinite(x)) return false;
  *v = x;
  return true;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Only a plausible typo is worth suggesting.
  if (best_d == std::string::npos || best_d > std::max<size_t>(2, name.size() / 3)) return {};
  return best;
}

std::string parse_param_value(const sieve_param_spec& spec, const std::string& raw,
                              sieve_param_value* value, std::string* owned_text,
                              std::vector<int64_t>* owned_list) {
  const std::string name = spec.name ? spec.name : "?";
  const std::string text = spec.type == SIEVE_PARAM_STRING ? raw : trim(raw);
  const std::string shown = printable(text);  // user text in a one-line message
  *value = sieve_param_value{};
  value->type = spec.type;
  owned_text->clear();
  owned_list->clear();
  auto in_range = [&](double x) { return x >= spec.min && x <= spec.max; };
  switch (spec.type) {
    case SIEVE_PARAM_BOOL: {
      static const char* const yes[] = {"true", "1", "yes", "on"};
      static const char* const no[] = {"false", "0", "no", "off"};
      for (auto* y : yes) if (text == y) { value->i = 1; return {}; }
      for (auto* n : no) if (text == n) { value->i = 0; return {}; }
      return name + "='" + shown + "' is not a bool (true or false)";
    }
    case SIEVE_PARAM_INT: {
      int64_t x;
      if (!parse_int(text, &x)) return name + "='" + shown + "' is not an integer";
      if (!in_range(double(x))) return name + "=" + shown + " is out of range " + range_text(spec);
      value->i = x;
      return {};
    }
    case SIEVE_PARAM_FLOAT: {
      double x;
      if (!parse_float(text, &x)) return name + "='" + shown + "' is not a finite number";
      if (!in_range(x)) return name + "=" + shown + " is out of range " + range_text(spec);
      value->f = x;
      return {};
    }
    case SIEVE_PARAM_STRING:
      *owned_text = text;
      return {};
    case SIEVE_PARAM_ENUM: {
      auto choices = split_choices(spec.choices);
      for (size_t i = 0; i < choices.size(); ++i)
        if (text == choices[i]) {
          value->i = int64_t(i);
          *owned_text = text;
          return {};
        }
      return name + "='" + shown + "' is not one of " + join(choices, "|");
    }
    case SIEVE_PARAM_INT_LIST: {
      std::string body = text;
      if (!body.empty() && body.front() == '[') {
        if (body.back() != ']') return name + "='" + shown + "': missing ']'";
        body = trim(body.substr(1, body.size() - 2));
      }
      if (body.empty()) return {};  // the empty list
      size_t start = 0;
      for (;;) {
        size_t comma = body.find(',', start);
        std::string item = trim(body.substr(start, comma == std::string::npos ? std::string::npos
                                                                               : comma - start));
        int64_t x;
        if (!parse_int(item, &x))
          return name + "='" + shown + "': '" + printable(item) + "' is not an integer (write [2,14,22])";
        if (!in_range(double(x)))
          return name + "=" + shown + ": element " + printable(item) + " is out of range " +
                 range_text(spec);
        owned_list->push_back(x);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return {};
    }
    default:
      return name + ": unknown parameter type " + std::to_string(spec.type);
  }
}

bool parse_params(const ParamSchema& schema, const ParamPairs& user, ParamValues* out,
                  std::vector<std::string>* errors, const std::string& who) {
  const std::string prefix = who.empty() ? "" : who + ": ";
  const size_t errors_before = errors->size();
  std::vector<std::string> names;
  for (uint32_t i = 0; i < schema.size(); ++i) names.push_back(schema[i].name ? schema[i].name : "");

  // Which user value goes to which parameter; refuse unknown and repeated names.
  std::vector<int> given(schema.size(), -1);
  for (size_t u = 0; u < user.size(); ++u) {
    const std::string& key = user[u].first;
    int idx = schema.find(key);
    if (idx < 0) {
      std::string line = prefix + "unknown parameter '" + printable(key) + "'";
      std::string near = closest_name(key, names);
      if (!near.empty())
        line += " (did you mean '" + near + "'?)";
      else if (names.empty())
        line += " (it takes no parameters)";
      else
        line += " (known: " + join(names, ", ") + ")";
      errors->push_back(line);
      continue;
    }
    if (given[idx] >= 0) {
      errors->push_back(prefix + "parameter '" + printable(key) + "' is given twice");
      continue;
    }
    given[idx] = int(u);
  }

  ParamValues values;
  for (uint32_t i = 0; i < schema.size(); ++i) {
    const auto& spec = schema[i];
    const bool from_user = given[i] >= 0;
    std::string text = from_user ? user[given[i]].second
                                 : (spec.default_value ? spec.default_value : "");
    sieve_param_value v;
    std::string owned;
    std::vector<int64_t> list;
    std::string err = parse_param_value(spec, text, &v, &owned, &list);
    if (!err.empty()) {
      errors->push_back(prefix + err + (from_user ? "" : " (the policy's own default)"));
      continue;
    }
    values.push(v, std::move(owned), std::move(list));
  }
  if (errors->size() != errors_before) return false;
  *out = std::move(values);
  return true;
}

std::vector<std::string> check_schema(const ParamSchema& schema) {
  std::vector<std::string> problems;
  std::set<std::string> seen;
  // The array's stride is parameter 0's struct_size; bound it before stepping by it.
  if (!schema.empty() && schema[0].hdr.struct_size > kMaxStructSize)
    return {"parameter 0: struct_size " + std::to_string(schema[0].hdr.struct_size) +
            " exceeds the limit " + std::to_string(kMaxStructSize)};
  for (uint32_t i = 0; i < schema.size(); ++i) {
    const auto& s = schema[i];
    const std::string where = "parameter " + std::to_string(i);
    if (s.hdr.struct_size < sizeof(sieve_param_spec)) {
      problems.push_back(where + ": struct_size " + std::to_string(s.hdr.struct_size) +
                         " < " + std::to_string(sizeof(sieve_param_spec)) + " (v1.0 size)");
      continue;  // the fields below may not be there
    }
    if (s.hdr.struct_size != schema[0].hdr.struct_size)
      problems.push_back(where + ": struct_size differs from parameter 0's (one array, one size)");
    if (!is_identifier(s.name)) {
      problems.push_back(where + ": name " + identifier_problem(s.name));
      continue;
    }
    const std::string n = s.name;
    if (!seen.insert(n).second) problems.push_back("parameter '" + n + "' is declared twice");
    if (s.type > SIEVE_PARAM_INT_LIST) {
      problems.push_back("parameter '" + n + "': unknown type " + std::to_string(s.type));
      continue;
    }
    if (auto why = text_problem(s.doc); !why.empty()) problems.push_back("parameter '" + n + "': " + why + " doc");
    // choices and default are read whole below: refuse them before that when unterminated.
    if (text_too_long(s.choices) || text_too_long(s.default_value)) {
      problems.push_back("parameter '" + n + "': choices or default longer than " +
                         std::to_string(kMaxTextLength) + " bytes");
      continue;
    }
    const bool ranged = s.type == SIEVE_PARAM_INT || s.type == SIEVE_PARAM_FLOAT ||
                        s.type == SIEVE_PARAM_INT_LIST;
    if (ranged && !(s.min <= s.max)) {  // also catches NaN bounds; no default can fit
      problems.push_back("parameter '" + n + "': min " + num(s.min) + " > max " + num(s.max));
      continue;
    }
    if (s.type == SIEVE_PARAM_ENUM) {
      auto choices = split_choices(s.choices);
      if (!s.choices || !*s.choices) {
        problems.push_back("parameter '" + n + "': enum without choices");
        continue;
      }
      std::set<std::string> uniq;
      for (auto& c : choices) {
        if (c.empty()) problems.push_back("parameter '" + n + "': empty enum choice in '" +
                                          std::string(s.choices) + "'");
        else if (!uniq.insert(c).second)
          problems.push_back("parameter '" + n + "': enum choice '" + c + "' repeated");
      }
    }
    if (!s.default_value) {
      problems.push_back("parameter '" + n + "': no default value");
      continue;
    }
    sieve_param_value v;
    std::string owned;
    std::vector<int64_t> list;
    std::string err = parse_param_value(s, s.default_value, &v, &owned, &list);
    if (!err.empty()) problems.push_back("parameter '" + n + "': default " + err);
  }
  return problems;
}

std::string format_schema(const ParamSchema& schema, const std::string& indent) {
  if (schema.empty()) return indent + "(no parameters)\n";
  struct Row { std::string name, type, def, range, doc; };
  std::vector<Row> rows;
  size_t wn = 0, wt = 0, wd = 0, wr = 0;
  for (uint32_t i = 0; i < schema.size(); ++i) {
    const auto& s = schema[i];
    Row r;
    r.name = s.name ? s.name : "?";
    r.type = param_type_name(s.type);
    r.def = "= " + std::string(s.default_value && *s.default_value ? s.default_value : "\"\"");
    if (s.type == SIEVE_PARAM_INT || s.type == SIEVE_PARAM_FLOAT || s.type == SIEVE_PARAM_INT_LIST)
      r.range = range_text(s);
    else if (s.type == SIEVE_PARAM_ENUM)
      r.range = "{" + std::string(s.choices ? s.choices : "") + "}";
    r.doc = s.doc ? s.doc : "";
    wn = std::max(wn, r.name.size());
    wt = std::max(wt, r.type.size());
    wd = std::max(wd, r.def.size());
    wr = std::max(wr, r.range.size());
    rows.push_back(std::move(r));
  }
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size(), ' '); };
  std::string out;
  for (const auto& r : rows) {
    std::string line = indent + pad(r.name, wn) + "  " + pad(r.type, wt) + "  " + pad(r.def, wd) +
                       "  " + pad(r.range, wr) + "  " + r.doc;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace sieve::runtime
