// Listed pages of host per-page tensors set to zero (page_zero.hpp).
#include <cstring>

#include "sieve/kv/page_zero.hpp"

namespace sieve::kv {

void zero_pages_cpu(const std::vector<PageBytes>& targets, const std::vector<int32_t>& pages) {
  for (int32_t p : pages)
    for (const PageBytes& t : targets)
      std::memset(static_cast<char*>(t.base) + size_t(p) * t.bytes_per_page, 0, t.bytes_per_page);
}

}  // namespace sieve::kv
