/* One entry of a layout table (layout_table.c): a field (offset, size), a struct (size, 0) or a
 * constant (value, 0), named by its source text. */
#ifndef SIEVE_TEST_V1_0_LAYOUT_ENTRY_H
#define SIEVE_TEST_V1_0_LAYOUT_ENTRY_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct sieve_layout_entry {
  const char* what;
  uint64_t a, b;
} sieve_layout_entry;
extern const sieve_layout_entry sieve_layout_frozen[];
extern const size_t sieve_layout_frozen_count;
extern const sieve_layout_entry sieve_layout_live[];
extern const size_t sieve_layout_live_count;
#ifdef __cplusplus
}
#endif
#endif
