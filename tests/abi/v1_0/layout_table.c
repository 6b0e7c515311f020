/* SIEVE_V1_0_LAYOUT expanded against whichever sieve/ headers the include path finds first:
 * built twice (CMakeLists.txt), as sieve_layout_frozen (tests/abi/v1_0) and sieve_layout_live
 * (api/). LAYOUT_NAME / LAYOUT_COUNT name the two tables. */
#include <sieve/sieve.h>
#include <stddef.h>

#include "layout_entry.h"
#include "layout_list.h"

#define LAYOUT_FIELD(t, f) {#t "." #f, offsetof(t, f), sizeof(((t*)0)->f)},
#define LAYOUT_SIZE(t) {"sizeof(" #t ")", sizeof(t), 0},
#define LAYOUT_VALUE(v) {#v, (uint64_t)(v), 0},

const sieve_layout_entry LAYOUT_NAME[] = {SIEVE_V1_0_LAYOUT(LAYOUT_FIELD, LAYOUT_SIZE, LAYOUT_VALUE)};
const size_t LAYOUT_COUNT = sizeof LAYOUT_NAME / sizeof LAYOUT_NAME[0];
