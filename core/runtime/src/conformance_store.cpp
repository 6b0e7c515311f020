// The KV-store suite of `sieve conform` (docs/conformance.md, "KV stores"): one store table driven
// through its C functions on every device it declares, against an f64 reference of every token
// it was given (conformance_store_driver.hpp). Each device runs in a forked child
// (conformance_isolation.hpp).
#include <algorithm>

#include "conformance_isolation.hpp"
#include "conformance_store_driver.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

namespace {

using namespace store_conform;

constexpr const char* kDeviceChecks[] = {"create", "page_table", "round_trip", "sidecars", "eviction",
                                         "remove", "refusals", "destroy"};

class DeviceChecks : StoreDriver {
 public:
  DeviceChecks(const StoreUnderTest& store, const Traits& traits, uint32_t device, HostServices& host, CheckSink& sink)
      : StoreDriver(store.api, traits, device, host), s_(sink) {}

  std::string name(const char* check) const { return std::string("store_") + check + "_" + device_word(device_); }

  void run() {
    run_check("create", [&] { return create(); });
    run_check("page_table", [&] { return scenario(dtype_, false); });
    run_check("round_trip", [&] { return round_trips(); });
    run_check("sidecars", [&] { return sidecars(); });
    run_check("eviction", [&] { return eviction(); });
    run_check("remove", [&] { return remove(); });
    run_check("refusals", [&] { return refusals(); });
    run_check("destroy", [&] { return destroy(); });
  }

 private:
  // A check body returns its pass detail, "skip: why" to skip, or throws CheckFailed.
  template <class F>
  void run_check(const char* check, F&& body) {
    const std::string n = name(check);
    s_.begin(n);
    try {
      std::string detail = body();
      if (detail.rfind("skip: ", 0) == 0) s_.skip(n, detail.substr(6));
      else s_.pass(n, detail);
    } catch (const CheckFailed& f) {
      s_.fail(n, f.why);
    } catch (const std::exception& e) {
      s_.fail(n, std::string("conformance harness error: ") + e.what());
    }
  }

  // ---- the checks --------------------------------------------------------------------------------

  std::string create() {
    auto in = make(dtype_, 16);
    const uint64_t b = bytes(*in);
    sieve_kv_config bad = config(dtype_, 16);
    bad.geometry.head_dim = 0;
    full_.head_dim = 0;
    Reasons r;
    sieve_kv_store* s = nullptr;
    const sieve_status st = api_->create(host_->table(), &bad, &s, r.sink());
    if (st == SIEVE_OK) {
      if (s) api_->destroy(s);
      failed("create accepted head_dim 0");
    }
    if (s) failed("create refused head_dim 0 with " + status_name(st) + " but left *out set");
    if (r.lines.empty() || r.empty_line()) failed("create refused head_dim 0 with " + status_name(st) + " but gave no reason");
    return "created (" + dtype_name(dtype_) + ", page " + std::to_string(page_) + ", bytes_in_use " + std::to_string(b) +
           "); head_dim 0 refused: " + status_name(st) + ", \"" + r.lines.front() + "\"";
  }

  // Ragged sequences appended in ragged batches (orders differ, a sequence absent from a batch,
  // pages crossed mid-append, decode steps), both layers with their own data; after every
  // append, views of every sequence and of a reordered subset.
  std::string scenario(DLDataType dtype, bool content) {
    const int32_t P = page_;
    auto in = make(dtype, 32);
    const Shape sh = shape(dtype, 32);
    const auto id = add(*in, 3);
    const int32_t A = id[0], B = id[1], C = id[2];
    const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> steps = {
        {{C, A}, {P - 3, 2 * P + 5}}, {{A, B, C}, {1, 5 * P + 1, P + 2}}, {{B, A}, {1, 1}}, {{A, B, C}, {P, 2, 3}}};
    int step = 0;
    for (const auto& [ids, counts] : steps) {
      ++step;
      for (int32_t layer : {0, 1}) append_ok(*in, layer, ids, counts);
      const std::string when = "after append " + std::to_string(step);
      for (int32_t layer : {0, 1}) {
        view(*in, layer, {A, B, C}, sh, content, when);
        view(*in, layer, {C, A}, sh, content, when);
      }
    }
    return std::to_string(steps.size()) + " ragged appends to 3 sequences over 2 layers" +
           (content ? "" : "; indptr, page ids, last_page_len and host mirrors valid after each");
  }

  // ENGINE_PAGES: every pool layout the descriptor declares; otherwise the store's own pages.
  std::vector<EngineLayout> layouts_under_test() const {
    if (!engine()) return {EngineLayout{}};
    std::vector<EngineLayout> out;
    if (traits_.layouts & SIEVE_KV_LAYOUT_HND) out.push_back({SIEVE_KV_LAYOUT_HND, 0});
    if (traits_.layouts & SIEVE_KV_LAYOUT_NHD) out.push_back({SIEVE_KV_LAYOUT_NHD, 0});
    if (traits_.layouts & SIEVE_KV_LAYOUT_COMBINED) {
      out.push_back({SIEVE_KV_LAYOUT_COMBINED, 0});
      out.push_back({SIEVE_KV_LAYOUT_COMBINED, 1});
    }
    return out;
  }

  std::string round_trips() {
    std::string done;
    for (uint32_t bit : {SIEVE_DTYPE_F32, SIEVE_DTYPE_F16, SIEVE_DTYPE_BF16}) {
      if (!(traits_.dtypes & bit)) continue;
      const DLDataType dt = dtype_of(bit);
      if (!traits_.declared) {  // a 1.0 table says nothing of its dtypes: one it refuses is not tried
        Instance probe(api_, *host_, config(dt, 32));
        if (probe.status != SIEVE_OK) continue;
      }
      std::string layouts;
      for (const EngineLayout& l : layouts_under_test()) {
        layout_ = l;
        scenario(dt, true);
        if (engine()) layouts += std::string(layouts.empty() ? " (" : ", ") + l.name();
      }
      layout_ = EngineLayout{};
      done += (done.empty() ? "" : ", ") + dtype_name(dt) + (layouts.empty() ? "" : layouts + ")") +
              (bit == SIEVE_DTYPE_F32 ? " exact" : " within one rounding (u = 2^" + std::string(bit == SIEVE_DTYPE_F16 ? "-11" : "-8") + ")");
    }
    if (done.empty()) failed("the store refused every dtype");
    return std::string("every resident token") + (pre_rope() ? " (K, V and pre-RoPE K)" : "") +
           " equals the f64 reference: " + done;
  }

  std::string sidecars() {
    if (!(traits_.features & SIEVE_KV_FEATURE_SIDECARS)) return "skip: the store has no sidecars";
    const int32_t P = page_, cap = 6, E = 3;
    auto in = make(dtype_, cap);
    const Shape sh = shape(dtype_, cap);
    sieve_sidecar_desc da{SIEVE_HEADER_INIT(sieve_sidecar_desc), "conform_a", kF32, E};
    sieve_sidecar_desc db{SIEVE_HEADER_INIT(sieve_sidecar_desc), "conform_b", kF32, 1};
    int32_t sa = -1, sb = -1, dup = -1;
    if (sieve_status st = api_->register_sidecar(in->s, &da, &sa); st != SIEVE_OK)
      failed("register_sidecar(conform_a) returned " + status_name(st) + ": " + in->last_error());
    if (sieve_status st = api_->register_sidecar(in->s, &db, &sb); st != SIEVE_OK)
      failed("register_sidecar(conform_b) returned " + status_name(st) + ": " + in->last_error());
    if (sa == sb) failed("two sidecars got the same slot " + std::to_string(sa));
    if (api_->register_sidecar(in->s, &da, &dup) == SIEVE_OK) failed("registering 'conform_a' twice was accepted");
    DLTensor junk{};
    if (api_->sidecar(in->s, 0, sa + sb + 7, &junk) == SIEVE_OK) failed("sidecar() of an unknown slot returned SIEVE_OK");
    const auto id = add(*in, 2);
    const int32_t A = id[0], B = id[1];
    append_ok(*in, 0, {A, B}, {3 * P, 2 * P});
    const int64_t row = int64_t(geometry_.n_kv_heads) * E;
    DLTensor ta = sidecar(*in, 0, sa, E, cap);
    std::vector<float> vals = read_sidecar(ta);
    ViewCopy vc = view(*in, 0, {A, B}, sh, false, "after the first appends");
    for (int32_t p : vc.indices)
      for (int64_t i = 0; i < row; ++i)
        if (vals[size_t(p * row + i)] != 0.f) failed("sidecar row of new page " + std::to_string(p) + " is not zero");
    for (int32_t p : vc.indices)  // each page's row holds its physical id + 1
      for (int64_t i = 0; i < row; ++i) vals[size_t(p * row + i)] = float(p + 1);
    write_sidecar(ta, vals);
    std::string note;
    if (traits_.features & SIEVE_KV_FEATURE_EVICTION) {
      const int32_t first = 0;
      uint64_t freed = 0;
      if (sieve_status st = do_evict(*in, 0, A, &first, 1, &freed); st != SIEVE_OK)
        failed("evict of A's first page returned " + status_name(st) + ": " + in->last_error());
      drop_page(ref_[{0, A}], 0);
      ViewCopy after = view(*in, 0, {A}, sh, false, "after evicting A's first page");
      vals = read_sidecar(sidecar(*in, 0, sa, E, cap));
      for (int32_t p : after.indices)
        if (vals[size_t(p * row)] != float(p + 1))
          failed("after an eviction shifted A's pages, the sidecar row of physical page " + std::to_string(p) +
                 " holds " + std::to_string(vals[size_t(p * row)]) + ", not what was written there (" + std::to_string(p + 1) +
                 "): sidecars must be indexed by physical page");
      note = ", rows stay with their physical pages across an eviction";
    }
    if (sieve_status st = do_remove(*in, B); st != SIEVE_OK)
      failed("remove_sequence returned " + status_name(st) + ": " + in->last_error());
    ref_.erase({0, B});
    const int32_t C = add(*in, 1)[0];
    const int32_t free_pages = cap - int32_t(view(*in, 0, {A}, sh, false, "before reuse").indices.size());
    append_ok(*in, 0, {C}, {free_pages * P});  // every free page, freed ones included
    ViewCopy vcc = view(*in, 0, {C}, sh, false, "after reallocating freed pages");
    for (int32_t slot : {sa, sb}) {
      const int32_t e = slot == sa ? E : 1;
      vals = read_sidecar(sidecar(*in, 0, slot, e, cap));
      for (int32_t p : vcc.indices)
        for (int64_t i = 0; i < int64_t(geometry_.n_kv_heads) * e; ++i)
          if (vals[size_t(p * geometry_.n_kv_heads * e + i)] != 0.f)
            failed("sidecar slot " + std::to_string(slot) + ": the row of page " + std::to_string(p) +
                   ", reallocated to a new sequence, was not zeroed");
    }
    return "2 slots registered (duplicate name refused), rows zero on (re)allocation" + note;
  }

  std::string eviction() {
    if (!(traits_.features & SIEVE_KV_FEATURE_EVICTION)) return "skip: the store does not evict";
    const int32_t P = page_;
    auto in = make(dtype_, 16);
    const Shape sh = shape(dtype_, 16);
    const auto id = add(*in, 2);
    const int32_t A = id[0], B = id[1];
    for (int32_t layer : {0, 1}) append_ok(*in, layer, {A, B}, {6 * P + 3, 2 * P});
    const uint64_t before = bytes(*in);
    const std::vector<int32_t> old = view(*in, 0, {A}, sh, true, "before eviction").pages(0);
    const int32_t evict[2] = {3, 1};  // any order
    uint64_t freed = 0;
    if (sieve_status st = do_evict(*in, 0, A, evict, 2, &freed); st != SIEVE_OK)
      failed("evict of logical pages {3, 1} returned " + status_name(st) + ": " + in->last_error());
    const uint64_t after = bytes(*in);
    if (after >= before)
      failed("evicting 2 pages left bytes_in_use at " + std::to_string(after) + " (was " + std::to_string(before) + ")");
    if (engine_ && !engine_->release_problems().empty()) failed(join(engine_->release_problems()));
    if (engine_ && engine_->tokens(0, A) != 4 * P + 3)
      failed("the store sent " + std::to_string((6 * P + 3 - engine_->tokens(0, A)) / P) +
             " pages to the release sink for an eviction of 2");
    if (freed != before - after)
      failed("evict reported " + std::to_string(freed) + " freed bytes, bytes_in_use fell by " + std::to_string(before - after));
    for (int32_t p : {3, 1}) drop_page(ref_[{0, A}], p);
    std::vector<int32_t> want = old;
    want.erase(want.begin() + 3);
    want.erase(want.begin() + 1);
    const std::vector<int32_t> now = view(*in, 0, {A, B}, sh, true, "after evicting {3, 1}").pages(0);
    if (now != want) failed("after evicting logical pages {3, 1} the page list is not the old one without them, in order");
    view(*in, 1, {A, B}, sh, true, "layer 1 after evicting in layer 0");
    append_ok(*in, 0, {A}, {P + 1});
    view(*in, 0, {A}, sh, true, "appending after an eviction");
    return "bytes_in_use " + std::to_string(before) + " -> " + std::to_string(after) +
           " (= freed_bytes); exactly the named pages left, later ones shifted down, the other layer untouched";
  }

  std::string remove() {
    const int32_t P = page_, cap = 8;
    auto in = make(dtype_, cap);
    const Shape sh = shape(dtype_, cap);
    const uint64_t base = bytes(*in);
    const auto id = add(*in, 2);
    const int32_t A = id[0], B = id[1];
    for (int32_t layer : {0, 1}) append_ok(*in, layer, {A, B}, {3 * P + 1, 2 * P});
    const uint64_t full = bytes(*in);
    if (full <= base) failed("bytes_in_use did not grow with 12 pages appended (" + std::to_string(full) + ")");
    if (sieve_status st = do_remove(*in, A); st != SIEVE_OK)
      failed("remove_sequence returned " + status_name(st) + ": " + in->last_error());
    ref_.erase({0, A});
    ref_.erase({1, A});
    const uint64_t half = bytes(*in);
    if (half >= full) failed("removing a sequence of 8 pages left bytes_in_use at " + std::to_string(half));
    int32_t len = 0;
    if (sieve_status st = api_->seq_len(in->s, 0, A, &len); st != SIEVE_ERR_NOT_FOUND)
      failed("seq_len of a removed sequence returned " + status_name(st) + ", expected SIEVE_ERR_NOT_FOUND");
    for (int32_t layer : {0, 1}) view(*in, layer, {B}, sh, true, "after removing the other sequence");
    if (sieve_status st = do_remove(*in, B); st != SIEVE_OK)
      failed("remove_sequence returned " + status_name(st) + ": " + in->last_error());
    ref_.clear();
    const uint64_t end = bytes(*in);
    if (end != base)
      failed("after removing every sequence bytes_in_use is " + std::to_string(end) + ", not the baseline " + std::to_string(base));
    const int32_t C = add(*in, 1)[0];  // every page must be free again: the whole pool fits
    append_ok(*in, 0, {C}, {cap * P});
    view(*in, 0, {C}, sh, true, "filling the pool after removals");
    return "bytes_in_use " + std::to_string(base) + " -> " + std::to_string(full) + " -> " + std::to_string(end) +
           "; every page reusable";
  }

  void expect(sieve_status got, std::initializer_list<sieve_status> want, const std::string& what, Instance& in,
              std::vector<std::string>* bad) {
    if (std::find(want.begin(), want.end(), got) == want.end()) {
      std::string w;
      for (auto s : want) w += (w.empty() ? "" : " or ") + status_name(s);
      bad->push_back(what + " returned " + status_name(got) + ", expected " + w);
    } else if (in.last_error().empty() || in.last_error() == "(null)") {
      bad->push_back(what + " was refused but last_error() is empty");
    }
  }

  std::string refusals() {
    const int32_t P = page_, cap = 4;
    auto in = make(dtype_, cap);
    const Shape sh = shape(dtype_, cap);
    const int32_t A = add(*in, 1)[0];
    append_ok(*in, 0, {A}, {3 * P});
    std::vector<std::string> bad;
    const int32_t ghost = A + 1000;
    int32_t len = 0;
    expect(api_->seq_len(in->s, 0, ghost, &len), {SIEVE_ERR_NOT_FOUND}, "seq_len of an unknown sequence", *in, &bad);
    sieve_paged_kv out{};
    expect(do_view(*in, 0, {ghost}, &out), {SIEVE_ERR_NOT_FOUND}, "view of an unknown sequence", *in, &bad);
    expect(append(*in, 0, {ghost}, {1}), {SIEVE_ERR_NOT_FOUND}, "append to an unknown sequence", *in, &bad);
    expect(do_remove(*in, ghost), {SIEVE_ERR_NOT_FOUND}, "remove_sequence of an unknown sequence", *in, &bad);
    expect(do_view(*in, 7, {A}, &out), {SIEVE_ERR_NOT_FOUND, SIEVE_ERR_INVALID_ARGUMENT}, "view of layer 7 of 2", *in, &bad);
    const uint64_t b0 = bytes(*in);
    if (!engine_) {  // an ENGINE_PAGES store's capacity is the host's pool, not the store's to refuse
      expect(append(*in, 0, {A}, {2 * P}), {SIEVE_ERR_CAPACITY}, "append of 2 pages with 1 free", *in, &bad);
      if (bytes(*in) != b0) bad.push_back("the refused append changed bytes_in_use");
    }
    expect(api_->append(in->s, nullptr), {SIEVE_ERR_INVALID_ARGUMENT}, "append(NULL)", *in, &bad);
    bind(*in, 0, {A});
    expect(api_->view(in->s, 0, &A, 1, nullptr), {SIEVE_ERR_INVALID_ARGUMENT}, "view with out NULL", *in, &bad);
    if (traits_.features & SIEVE_KV_FEATURE_EVICTION) {
      uint64_t freed = 0;
      const int32_t last = 2, dup[2] = {0, 0}, out_of_range = 3, negative = -1, first = 0;
      expect(do_evict(*in, 0, A, &last, 1, &freed), {SIEVE_ERR_INVALID_ARGUMENT}, "evict of the last page", *in, &bad);
      expect(do_evict(*in, 0, A, dup, 2, &freed), {SIEVE_ERR_INVALID_ARGUMENT}, "evict of page 0 twice", *in, &bad);
      expect(do_evict(*in, 0, A, &out_of_range, 1, &freed), {SIEVE_ERR_INVALID_ARGUMENT}, "evict of page 3 of 3", *in, &bad);
      expect(do_evict(*in, 0, A, &negative, 1, &freed), {SIEVE_ERR_INVALID_ARGUMENT}, "evict of page -1", *in, &bad);
      expect(do_evict(*in, 0, ghost, &first, 1, &freed), {SIEVE_ERR_NOT_FOUND}, "evict in an unknown sequence", *in, &bad);
      if (bytes(*in) != b0) bad.push_back("a refused evict changed bytes_in_use");
    }
    if (!bad.empty()) failed(join(bad));
    view(*in, 0, {A}, sh, true, "after the refusals");  // nothing refused changed the store
    append_ok(*in, 0, {A}, {P});                        // the last free page still fits
    view(*in, 0, {A}, sh, true, "filling the last page");
    return std::string("unknown ids NOT_FOUND, ") + (engine_ ? "" : "over capacity CAPACITY, ") +
           "NULL arguments and bad evictions INVALID_ARGUMENT; the store unchanged by each";
  }

  std::string destroy() {
    engine_.reset();  // the previous check's pool
    const int64_t held = host_->bytes_held();
    {
      auto in = make(dtype_, 8);
      const auto id = add(*in, 2);
      for (int32_t layer : {0, 1}) append_ok(*in, layer, id, {2 * page_ + 1, 3});
      if (traits_.features & SIEVE_KV_FEATURE_SIDECARS) {
        sieve_sidecar_desc d{SIEVE_HEADER_INIT(sieve_sidecar_desc), "conform_a", kF32, 2};
        int32_t slot = 0;
        api_->register_sidecar(in->s, &d, &slot);
      }
      in.reset();
      engine_.reset();  // the suite's own pool last: the store borrowed it
    }
    const int64_t after = host_->bytes_held();
    if (after != held)
      failed("after destroy the store still holds " + std::to_string(after - held) + " bytes of host-services memory");
    return "destroy returned every byte it took through the host services";
  }

  CheckSink& s_;
};

// validate() (ABI 1.1): accepts the config the device checks use; refuses, each with a status and
// a reason, head_dim 0 and what the descriptor does not declare (a dtype, a page size, a device).
// validate never touches a device, so a CUDA config is asked on any machine.
void validate_check(const StoreUnderTest& st, const Traits& t, CheckSink& s) {
  const std::string n = "store_validate";
  if (!SIEVE_HAS_FIELD(st.api, sieve_kv_store_api, validate) || !st.api->validate)
    return s.skip(n, "no validate() (create decides)");
  s.begin(n);
  const sieve_geometry g = suite_geometry(t, t.devices & SIEVE_DEVICE_CPU ? SIEVE_DEVICE_CPU : SIEVE_DEVICE_CUDA);
  ParamValues params;
  std::vector<std::string> errors;  // the table check parsed the defaults
  if (st.api->n_params) parse_params(ParamSchema(st.api->params, st.api->n_params), {}, &params, &errors);
  auto ask = [&](sieve_geometry geo, Reasons* r) {
    sieve_kv_config c{};
    c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    c.geometry = geo;
    c.geometry_ref = &geo;
    c.pages_per_layer = 32;
    c.params = params.data();
    c.n_params = params.size();
    return st.api->validate(&c, r->sink());
  };
  Reasons ok;
  if (sieve_status a = ask(g, &ok); a != SIEVE_OK || !ok.lines.empty())
    return s.fail(n, "validate refused the declared config: " + status_name(a) + ", " + join(ok.lines));
  std::vector<std::pair<sieve_geometry, std::string>> bad;
  sieve_geometry b = g;
  b.head_dim = b.rope_dim = 0;
  bad.emplace_back(b, "head_dim 0");
  if (t.declared) {
    for (uint32_t bit : {SIEVE_DTYPE_F32, SIEVE_DTYPE_F16, SIEVE_DTYPE_BF16})
      if (!(t.dtypes & bit)) {
        b = g;
        b.kv_dtype = dtype_of(bit);
        bad.emplace_back(b, "undeclared dtype " + dtype_names(bit));
        break;
      }
    if (!t.page_sizes.empty())
      for (int32_t p : {3, 7, 48, 1000})
        if (std::find(t.page_sizes.begin(), t.page_sizes.end(), p) == t.page_sizes.end()) {
          b = g;
          b.page_size = p;
          bad.emplace_back(b, "unlisted page size " + std::to_string(p));
          break;
        }
    if (!(t.devices & SIEVE_DEVICE_CPU) || !(t.devices & SIEVE_DEVICE_CUDA)) {
      b = g;
      b.device = t.devices & SIEVE_DEVICE_CPU ? DLDevice{kDLCUDA, 0} : kCpu;
      bad.emplace_back(b, std::string("undeclared device ") + (t.devices & SIEVE_DEVICE_CPU ? "cuda" : "cpu"));
    }
  }
  std::string said;
  for (const auto& [geo, what] : bad) {
    Reasons no;
    const sieve_status r = ask(geo, &no);
    if (r == SIEVE_OK) return s.fail(n, "validate accepted " + what);
    if (no.lines.empty() || no.empty_line())
      return s.fail(n, "validate refused " + what + " with " + status_name(r) + " but gave no reason");
    said += "; " + what + ": " + status_name(r) + ", \"" + no.lines.front() + "\"";
  }
  s.pass(n, "accepts the declared config" + said);
}

}  // namespace

const std::vector<std::string>& store_check_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"store_table", "store_validate"};
    for (const char* dev : {"cpu", "cuda"})
      for (const char* c : kDeviceChecks) v.push_back(std::string("store_") + c + "_" + dev);
    return v;
  }();
  return names;
}

void conform_store(const StoreUnderTest& store, const ConformOptions& options, ConformReport* report) {
  const size_t first = report->checks.size();
  Traits traits;
  bool table_ok = false;
  // The table itself: what the loader checks (1.1 descriptor and schema included).
  run_isolated(
      [&](CheckSink& s) {
        s.begin("store_table");
        auto problems = check_kv_store_api(store.api);
        if (!problems.empty()) return s.fail("store_table", join(problems));
        const Traits t = traits_of(store);
        s.pass("store_table", std::string(t.declared ? "descriptor" : "1.0 table (no descriptor)") + ": devices " +
                                  device_names(t.devices) + ", dtypes " + dtype_names(t.dtypes) +
                                  (t.features & SIEVE_KV_FEATURE_SIDECARS ? ", sidecars" : "") +
                                  (t.features & SIEVE_KV_FEATURE_EVICTION ? ", eviction" : "") +
                                  (t.features & SIEVE_KV_FEATURE_ENGINE_PAGES ? ", engine pages" : ""));
        validate_check(store, t, s);
      },
      "store_table", {"store_validate"}, options, report);
  for (size_t i = first; i < report->checks.size(); ++i)
    if (report->checks[i].name == "store_table") table_ok = report->checks[i].passed;
  if (table_ok) traits = traits_of(store);  // the table passed its checks in a child: safe to read here
  for (uint32_t dev : {SIEVE_DEVICE_CPU, SIEVE_DEVICE_CUDA}) {
    std::vector<std::string> names;
    for (const char* c : kDeviceChecks) names.push_back(std::string("store_") + c + "_" + device_word(dev));
    if (!table_ok) {
      for (auto& n : names) report->skip(n, "not run: store_table failed");
      continue;
    }
    if (!(traits.devices & dev)) {
      for (auto& n : names) report->skip(n, std::string("the store does not declare ") + device_word(dev));
      continue;
    }
    run_isolated(
        [&](CheckSink& s) {
          // In the child: CUDA is initialised only here (a parent that initialised it could not fork).
          if (dev == SIEVE_DEVICE_CUDA && cuda_devices() == 0) {
            for (auto& n : names) s.skip(n, "the store declares CUDA and this machine has no usable CUDA device (run on a GPU machine)");
            return;
          }
          HostServices host(dev == SIEVE_DEVICE_CUDA ? DLDevice{kDLCUDA, 0} : kCpu);
          DeviceChecks(store, traits, dev, host, s).run();
        },
        std::string("store_") + device_word(dev), names, options, report);
  }
  for (size_t i = first; i < report->checks.size(); ++i) report->checks[i].store = store.name;
}

}  // namespace sieve::runtime
