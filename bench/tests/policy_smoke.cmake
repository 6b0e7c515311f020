# CTest: `sieve_bench --policy --device cpu` at tiny sizes, dense vs streaming, decode and prefill,
# the core store beside the engine-pool store;
# then checks that the JSON has every field with plausible values (a real run: fails if the
# benchmark fails, writes no JSON, loses a row, or reports numbers that cannot be right).
#   cmake -DBENCH=<sieve_bench> -DPLUGINS=<plugin dir> -DOUT=<dir> [-DDEVICE=cuda] -P policy_smoke.cmake
# With DEVICE=cuda (bf16, head_dim 64) it prints POLICY_SMOKE_SKIPPED and stops when there is no
# CUDA device (the test's SKIP_REGULAR_EXPRESSION).
cmake_minimum_required(VERSION 3.25)
file(MAKE_DIRECTORY ${OUT})
if(NOT DEVICE)
  set(DEVICE cpu)
endif()
if(DEVICE STREQUAL "cuda")
  set(DT --dtype bf16)
  set(D1 64)
  set(D2 64)
  execute_process(COMMAND ${BENCH} --policy --device cuda --ctx 16 --hq 4 --hkv 2 --d 64 --steps 1
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(err MATCHES "no CUDA device")
    message(STATUS "POLICY_SMOKE_SKIPPED: ${err}")
    return()
  endif()
else()
  set(DT --dtype f32)
  set(D1 32)
  set(D2 16)
endif()

function(fail what)
  message(FATAL_ERROR "policy bench check failed: ${what}")
endfunction()

# The number at results[i].key into `var`; fails when it is missing or not a number > 0.
function(positive var i key)
  string(JSON v ERROR_VARIABLE e GET "${text}" results ${i} ${key})
  if(e OR NOT v MATCHES "^[0-9.eE+-]+$" OR NOT v GREATER 0)
    fail("results[${i}].${key} = '${v}' is not a positive number ${e}")
  endif()
  set(${var} ${v} PARENT_SCOPE)
endfunction()

function(run_bench name)
  set(json ${OUT}/${name}.json)
  file(REMOVE ${json})
  execute_process(COMMAND ${BENCH} --policy --device ${DEVICE} --plugin-dir ${PLUGINS} --json ${json} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${name}:\n${out}${err}")
  if(NOT rc EQUAL 0)
    fail("sieve_bench --policy (${name}) exited with ${rc}")
  endif()
  file(READ ${json} text)
  set(text "${text}" PARENT_SCOPE)
endfunction()

# ---- decode: 2 layers, 2 contexts x 2 batches, dense + streaming ------------------------------
run_bench(decode --phase decode --layers 2 --hq 4 --hkv 2 --d ${D1} --page 16 ${DT}
          --ctx 256,320 --batch 1,2 --steps 3 --warmup 1 --chain "streaming(sink=8,window=32)")
foreach(key device date command phase)
  string(JSON v ERROR_VARIABLE e GET "${text}" meta ${key})
  if(e OR v STREQUAL "")
    fail("meta.${key} missing")
  endif()
endforeach()
string(JSON n LENGTH "${text}" results)
if(NOT n EQUAL 8)  # 2 contexts x 2 batches x (dense, streaming)
  fail("${n} rows, expected 8")
endif()
math(EXPR last "${n} - 1")
# Tokens each sequence gained in the timed steps (1 + 3, the recorded one, and on CUDA the same
# 1 + 3 again with CUDA graphs on).
string(JSON growth GET "${text}" meta decode_store_growth_tokens)
if(DEVICE STREQUAL "cuda")
  set(want_growth 9)
else()
  set(want_growth 5)
endif()
if(NOT growth EQUAL want_growth)
  fail("meta.decode_store_growth_tokens = ${growth}, expected ${want_growth}")
endif()
foreach(i RANGE ${last})
  string(JSON chain GET "${text}" results ${i} chain)
  string(JSON err ERROR_VARIABLE none GET "${text}" results ${i} error)
  if(NOT none)
    fail("row ${i} (${chain}) failed: ${err}")
  endif()
  foreach(key step_ms dense_step_ms speedup_vs_dense core_ms core_dense_ms attended_fraction
              resident_fraction kv_bytes batch layers context n_q_heads n_kv_heads head_dim samples)
    positive(v ${i} ${key})
  endforeach()
  if(DEVICE STREQUAL "cuda")
    # The graph pass: dense (the empty chain, cuda_graph full) is replayed from graphs (3 steps
    # after a warm-up, 2 layers: at least one replay); streaming (static_shapes) runs eagerly and
    # says why.
    positive(v ${i} step_graph_ms)
    string(JSON replays GET "${text}" results ${i} graph_replays)
    string(JSON why ERROR_VARIABLE no_reason GET "${text}" results ${i} graph_eager_reason)
    if(chain STREQUAL "dense" AND (replays LESS 1 OR NOT no_reason))
      fail("dense row ${i}: ${replays} graph replays, eager reason '${why}'")
    endif()
    if(NOT chain STREQUAL "dense" AND (NOT replays EQUAL 0 OR NOT why MATCHES "static_shapes"))
      fail("row ${i} (${chain}): ${replays} graph replays, eager reason '${why}'")
    endif()
  endif()
  string(JSON over ERROR_VARIABLE e GET "${text}" results ${i} selection_overhead_ms)
  if(e)
    fail("results[${i}].selection_overhead_ms missing")
  endif()
  positive(att ${i} attended_fraction)
  positive(res ${i} resident_fraction)
  if(res LESS 0.999 OR res GREATER 1.001)
    fail("row ${i}: nothing evicts, resident fraction ${res}")
  endif()
  if(chain STREQUAL "dense")
    if(att LESS 0.999 OR att GREATER 1.001)
      fail("dense row ${i} attends ${att} of the keys")
    endif()
  else()
    # Exactly, after `growth` (< 16) appended tokens on a context of whole pages: the sink page
    # (16 keys) + the pages of the last 32 positions (16 + 16 + growth keys), of ctx + growth
    # keys: 53/261 and 53/325 on the CPU (5 tokens), 57/265 and 57/329 on CUDA (9). Compared
    # as 7-digit decimals (CMake's math is integer).
    string(JSON ctx GET "${text}" results ${i} context)
    math(EXPR logical "${ctx} + ${growth}")
    math(EXPR keys "48 + ${growth}")
    math(EXPR want7 "${keys} * 10000000 / ${logical}")
    math(EXPR lo7 "${want7} - 10")
    math(EXPR hi7 "${want7} + 10")
    foreach(x want7 lo7 hi7)
      string(LENGTH "${${x}}" len)
      math(EXPR pad "7 - ${len}")
      string(REPEAT "0" ${pad} zeros)
      set(${x} "0.${zeros}${${x}}")
    endforeach()
    if(att LESS lo7 OR att GREATER hi7)
      fail("streaming row ${i} (ctx ${ctx}) attends ${att} of the keys, expected ${keys}/${logical} = ${want7}")
    endif()
  endif()
endforeach()

# ---- prefill: the last 64 of 200 tokens, dense + streaming -------------------------------------
run_bench(prefill --phase prefill --layers 1 --hq 4 --hkv 1 --d ${D2} --page 16 ${DT}
          --ctx 200 --new 64 --batch 2 --samples 2 --chain "prefill:*=streaming(sink=4,window=16)")
string(JSON n LENGTH "${text}" results)
if(NOT n EQUAL 2)
  fail("${n} prefill rows, expected 2")
endif()
positive(att0 0 attended_fraction)
positive(att1 1 attended_fraction)
positive(step1 1 step_ms)
positive(core1 1 core_ms)
string(JSON nnew GET "${text}" results 1 new_tokens)
if(att0 LESS 0.999 OR att1 GREATER 0.6 OR att1 LESS 0.05 OR NOT nnew EQUAL 64)
  fail("prefill: dense attends ${att0}, streaming ${att1}, new tokens ${nnew}")
endif()

# ---- a policy that evicts (when the raas plugin is built): the context reaches its hooks -------
# (LayerRunner::append_only calls on_append, end_step evicts to the budget: resident < 100%).
if(WITH_RAAS)
  run_bench(raas --phase decode --layers 2 --hq 4 --hkv 2 --d ${D1} --page 16 ${DT} --ctx 512 --batch 2
            --steps 3 --warmup 1 --chain "decode:*=raas(token_budget=64)")
  positive(res 1 resident_fraction)
  positive(bytes0 0 kv_bytes)
  positive(bytes1 1 kv_bytes)
  if(res GREATER 0.5 OR NOT bytes1 LESS bytes0)
    fail("raas kept ${res} of the tokens, ${bytes1} bytes against dense ${bytes0}")
  endif()
endif()

# ---- the engine-pool store beside the core store, in one run ------------------------------------
# Every chain runs on each --kv-store in turn; over engine_pool a stand-in engine owns the pages
# (shuffled, HND and NHD) and binds its table before every layer call. The stores hold the same
# K/V, so each engine_pool row must attend, keep and count exactly what the first store's row
# does, and carry its step time as a ratio of that row's.
function(check_stores n_stores)
  string(JSON n LENGTH "${text}" results)
  string(JSON nmeta LENGTH "${text}" meta kv_stores)
  if(NOT nmeta EQUAL n_stores)
    fail("meta.kv_stores has ${nmeta} entries, expected ${n_stores}")
  endif()
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    math(EXPR at "${i} % ${n_stores}")
    math(EXPR base "${i} - ${at}")
    string(JSON store GET "${text}" results ${i} kv_store)
    string(JSON want GET "${text}" meta kv_stores ${at})
    string(JSON err ERROR_VARIABLE none GET "${text}" results ${i} error)
    if(NOT none)
      fail("row ${i} (${store}) failed: ${err}")
    endif()
    if(NOT store STREQUAL want)
      fail("row ${i} ran on '${store}', expected '${want}' (each chain on every store in turn)")
    endif()
    if(at GREATER 0)
      positive(ratio ${i} step_ratio_vs_base_store)
      foreach(key attended_fraction resident_fraction kv_bytes selection chain)
        string(JSON a GET "${text}" results ${base} ${key})
        string(JSON b GET "${text}" results ${i} ${key})
        if(NOT a STREQUAL b)
          fail("row ${i} (${store}): ${key} '${b}', the base store's row ${base}: '${a}'")
        endif()
      endforeach()
    endif()
  endforeach()
endfunction()
set(evicting "streaming(sink=8,window=32)")
if(WITH_RAAS)
  set(evicting "decode:*=raas(token_budget=64)")
endif()
run_bench(stores --phase decode --layers 2 --hq 4 --hkv 2 --d ${D1} --page 16 ${DT} --ctx 256 --batch 2
          --steps 3 --warmup 1 --chain "${evicting}" --kv-store paged --kv-store engine_pool
          --kv-store "engine_pool(layout=nhd)")
string(JSON n LENGTH "${text}" results)
if(NOT n EQUAL 6)  # (dense, the chain) x 3 stores
  fail("${n} rows over three stores, expected 6")
endif()
check_stores(3)
if(WITH_RAAS)  # RaaS evicted over the engine's pages too (the bytes are equal: check_stores)
  positive(res 4 resident_fraction)
  if(res GREATER 0.5)
    fail("raas over engine_pool kept ${res} of the tokens")
  endif()
endif()
run_bench(stores_prefill --phase prefill --layers 1 --hq 4 --hkv 1 --d ${D2} --page 16 ${DT} --ctx 200 --new 64
          --batch 2 --samples 2 --chain "prefill:*=streaming(sink=4,window=16)" --kv-store paged
          --kv-store "engine_pool(layout=combined)")
check_stores(2)
execute_process(COMMAND ${BENCH} --policy --device ${DEVICE} --plugin-dir ${PLUGINS} --kv-store engine_pol --ctx 64
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "^sieve_bench --policy: --kv-store 'engine_pol': [^\n]*unknown KV store 'engine_pol'[^\n]*\n$")
  fail("an unknown store gave status ${rc}: ${err}")
endif()

# ---- bad input: one line and a non-zero status --------------------------------------------------
execute_process(COMMAND ${BENCH} --policy --device ${DEVICE} --plugin-dir ${PLUGINS} --chain "nosuchpolicy" --ctx 64
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "nosuchpolicy")
  fail("an unknown policy gave status ${rc}: ${err}")
endif()
execute_process(COMMAND ${BENCH} --policy --ctx 0 RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  fail("--ctx 0 gave status ${rc}")
endif()
message(STATUS "policy bench smoke test passed")
