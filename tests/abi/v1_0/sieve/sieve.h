/* Sieve ABI v1 — umbrella header for plugin authors. */
#ifndef SIEVE_SIEVE_H
#define SIEVE_SIEVE_H
#include "sieve/abi.h"
#include "sieve/kv_store.h"
#include "sieve/attention.h"
#include "sieve/host_services.h"
#include "sieve/policy.h"
#include "sieve/plugin.h"
#endif
