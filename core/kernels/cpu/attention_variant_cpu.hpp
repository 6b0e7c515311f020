// The CPU kernel of an attention variant (sieve_attention_variant: key spans, packed keys, count
// weighting, logit bias), called by attend_cpu for args whose variant is set. Internal to
// core/kernels.
#pragma once
#include <string>

#include "sieve/attention.h"

namespace sieve::kernels {

// `a` passed check_attention_args, lives in host memory and has a variant. Checks the variant's
// contents (check_variant_contents), then computes every query row into out (and lse).
sieve_status attend_variant_cpu(const sieve_attention_args& a, int threads, std::string* error);

}  // namespace sieve::kernels
