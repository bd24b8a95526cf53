# slot_sim from the outside, as a user runs it: cmake -DSIM=<slot_sim> -DWORK=<dir> -DCASE=<case> -P cli_test.cmake
#   bad_input     every kind of bad setting or trace exits with status 2 and names the option or file:line
#   trace         a generated workload written as a trace and replayed gives the same runs
#   shards        three shards merged give exactly the unsharded sweep
#   smoke         a small sweep prints both tables and writes every output file
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(sim)
  execute_process(COMMAND "${SIM}" ${ARGN} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_ok)
  sim(${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "slot_sim ${ARGN}: exit ${rc}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# expect_error(<message> <args>...): exit status 2 and `slot_sim: error: <message>` on stderr.
function(expect_error message)
  sim(${ARGN})
  string(FIND "${err}" "slot_sim: error: ${message}" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "slot_sim ${ARGN}: expected exit 2 and\n  slot_sim: error: ${message}\n"
                        "got exit ${rc} and\n${err}${out}")
  endif()
endfunction()

# Lines of a file, sorted, with the first `skip` fields of each line removed.
function(sorted_lines file skip var)
  file(STRINGS "${file}" lines)
  set(result)
  foreach(line IN LISTS lines)
    foreach(k RANGE 1 ${skip})
      if(skip GREATER 0)
        string(REGEX REPLACE "^[^,]*," "" line "${line}")
      endif()
    endforeach()
    list(APPEND result "${line}")
  endforeach()
  list(SORT result)
  set(${var} "${result}" PARENT_SCOPE)
endfunction()

function(expect_same a b skip)
  sorted_lines("${a}" ${skip} la)
  sorted_lines("${b}" ${skip} lb)
  if(NOT la STREQUAL lb)
    message(FATAL_ERROR "${a} and ${b} differ")
  endif()
endfunction()

set(quick --workgroups 200 --cost off --sample-every 50)

if(CASE STREQUAL "bad_input")
  expect_error("--sizes: value -3 is negative" --sizes "uniform -3 8")
  expect_error("--sizes: 'uniform 1 200' can draw 200 slots, more than the 128 slots of a compute unit"
               --sizes "uniform 1 200")
  expect_error("--shard: 5 shards for 4 seeds: some would be empty" --seeds 4 --shard 2/5)
  expect_error("--durations: 'uniform 10': expected 'uniform LO HI'" --durations "uniform 10")
  expect_error("--workgroups: workgroups -5 is negative" --workgroups -5)
  expect_error("--slots: slots must be one of 64, 128, 256, 512 (got 100)" --slots 100)
  expect_error("--policies: unknown policy 'worst-fit'" --policies first-fit,worst-fit)
  expect_error("--shard: shard 3/2: the index must lie in 1..2" --shard 3/2)
  expect_error("--seedz: unknown setting 'seedz' (see --help)" --seedz 4)

  file(WRITE "${WORK}/negative.csv" "arrival,size,duration\n0,4,10\n0,-3,10\n")
  expect_error("negative.csv:3: size -3 is negative" --trace negative.csv)
  file(WRITE "${WORK}/too_big.csv" "0,4,10\n0,129,10\n")
  expect_error("too_big.csv:2: size 129 is outside 1..128 (the slots of a compute unit)" --trace too_big.csv)
  file(WRITE "${WORK}/empty.csv" "arrival,size,duration\n")
  expect_error("empty.csv: the trace holds no workgroups" --trace empty.csv)
  file(WRITE "${WORK}/malformed.csv" "0,4,10\n0,4\n")
  expect_error("malformed.csv:2: expected 3 or 4 fields (arrival,size,duration[,expected]), found 2"
               --trace malformed.csv)
  file(WRITE "${WORK}/words.csv" "0,4,10\nzero,4,10\n")
  expect_error("words.csv:2: arrival 'zero' is not a whole number" --trace words.csv)
  expect_error("missing.csv: cannot open the trace" --trace missing.csv)

  file(WRITE "${WORK}/bad.conf" "# a config file\nseeds = 10\nsizes = uniform 0 4\n")
  expect_error("bad.conf:3: 'uniform 0 4': values must be at least 1" --config bad.conf)
  file(WRITE "${WORK}/noeq.conf" "seeds 10\n")
  expect_error("noeq.conf:1: expected 'key = value', found 'seeds 10'" --config noeq.conf)
  file(WRITE "${WORK}/big.conf" "slots = 64\n\nsizes = uniform 1 100\n")
  expect_error("big.conf:3: 'uniform 1 100' can draw 100 slots, more than the 64 slots of a compute unit"
               --config big.conf)
  file(WRITE "${WORK}/neg.conf" "\nhint-noise = -1\n")
  expect_error("neg.conf:2: hint-noise must lie in [0, 5] (got -1)" --config neg.conf)

  expect_ok(--seeds 4 ${quick} --out part1 --shard 1/2)
  expect_error("merge: the shards hold 2 of the sweep's 4 seeds: some shards are missing" merge all part1)
  expect_ok(--seeds 4 --workgroups 300 --cost off --sample-every 50 --out other --shard 2/2)
  expect_error("other/config.txt: settings differ from part1/config.txt: not one sweep" merge all part1 other)
  expect_error("nowhere/config.txt: cannot open (is this a slot_sim output folder?)" merge all nowhere)

elseif(CASE STREQUAL "trace")
  expect_ok(--write-trace seed5.csv --seed 5 --workgroups 300 --hint-noise 0.3)
  expect_ok(--trace seed5.csv --out replayed ${quick})
  expect_ok(--seeds 1 --seed 5 --workgroups 300 --hint-noise 0.3 --out generated --cost off --sample-every 50)
  expect_same("${WORK}/replayed/runs.csv" "${WORK}/generated/runs.csv" 1) # all but the seed column
  expect_same("${WORK}/replayed/series.csv" "${WORK}/generated/series.csv" 0)
  expect_same("${WORK}/replayed/wear.csv" "${WORK}/generated/wear.csv" 0)

elseif(CASE STREQUAL "shards")
  expect_ok(--seeds 6 ${quick} --out full)
  foreach(i 1 2 3)
    expect_ok(--seeds 6 ${quick} --out part${i} --shard ${i}/3)
  endforeach()
  expect_ok(merge merged part1 part2 part3)
  foreach(file runs.csv series.csv wear.csv summary.csv config.txt)
    expect_same("${WORK}/merged/${file}" "${WORK}/full/${file}" 0)
  endforeach()

elseif(CASE STREQUAL "smoke")
  expect_ok(--seeds 8 --workgroups 300 --threads 2 --out smoke)
  foreach(text "Makespan" "While workgroups wait" "boundary-nearest" "release-aligned" "bound")
    string(FIND "${out}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the report lacks '${text}':\n${out}")
    endif()
  endforeach()
  foreach(file runs.csv summary.csv series.csv wear.csv config.txt fig12_remaining.svg fig13_free_slots.svg
               fig14_makespan_delta.svg wear.svg)
    if(NOT EXISTS "${WORK}/smoke/${file}")
      message(FATAL_ERROR "missing output ${file}")
    endif()
  endforeach()
  # The written settings reproduce a run (without timings, which vary).
  expect_ok(--seeds 3 ${quick} --hint-noise 0.2 --out first)
  expect_ok(--config first/config.txt --out again)
  expect_same("${WORK}/first/summary.csv" "${WORK}/again/summary.csv" 0)
  expect_ok(--help)
  string(FIND "${out}" "usage: slot_sim" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "--help prints no usage")
  endif()
else()
  message(FATAL_ERROR "unknown CASE '${CASE}'")
endif()
