# Runs carve_replay on a trace and checks its output: every regex in EXPECT must match, none in
# FORBID may. A trace that is absent (the shared real snapshot beside the repository) makes the
# test print "skipped: <trace> is absent", which ctest reports as skipped.
# cmake -DREPLAY=<carve_replay> -DTRACE=<file> -DARGS=<a;b> -DEXPECT=<re;re> [-DFORBID=<re;re>]
#       [-DWRITE=<snapshot>] [-DEXIT_CODE=<n>] -P replay_test.cmake
#
# WRITE: TRACE is first written as one of the snapshots below, which no committed file holds. They
# are text pickles, byte for byte what Python's pickle.dumps(snapshot, 0) writes (protocol 0: one
# opcode a line, ints beyond 2^31 - 1 as LONG text), except stack_global, written by hand.
#   no_events     a segment of 2 MiB with one live block of 512 bytes, and device_traces [[]]:
#                 what _dump_snapshot() writes when the history was not recorded or was cleared
#   text_ints     the same segment, and one block of 1024 bytes allocated and freed, between an
#                 oom event (device_free in place of addr) and a snapshot event, every event with
#                 frames whose C++ frame has line 2^64 - 1 (LONG text beyond 64-bit signed)
#   stack_global  a dict whose value calls os.system('touch carve_replay_was_tricked') through
#                 STACK_GLOBAL and REDUCE (protocol 4)
# EXIT_CODE: the exit status expected (default 0); where it is not 0, EXPECT and FORBID are matched
# against stdout and stderr together. Whatever the case, the test fails if the file a pickle's call
# would have made exists.
if(DEFINED WRITE AND NOT WRITE STREQUAL "")
  # The segment and its blocks, as both snapshots hold them (Python memoises each str once: p5 is
  # 'address', p7 'stream', p14 'size', p15 'requested_size', p16 'state').
  set(segments [=[(dp0
Vsegments
p1
(lp2
(dp3
Vdevice
p4
I0
sVaddress
p5
L139637976727552L
sVtotal_size
p6
I2097152
sVstream
p7
I0
sVsegment_type
p8
Vsmall
p9
sVis_expandable
p10
I00
sVblocks
p11
(lp12
(dp13
g5
L139637976727552L
sVsize
p14
I512
sVrequested_size
p15
I500
sVstate
p16
Vactive_allocated
p17
sa(dp18
g5
L139637976728064L
sg14
I2096640
sg15
I0
sg16
Vinactive
p19
sasasVdevice_traces
p20
(lp21
(lp22
]=])
  if(WRITE STREQUAL "no_events")
    file(WRITE "${TRACE}" "${segments}as.")
  elseif(WRITE STREQUAL "text_ints")
    file(WRITE "${TRACE}" "${segments}" [=[(dp23
Vaction
p24
Valloc
p25
sVaddr
p26
L139637976728064L
sg14
I1024
sg7
I0
sVtime_us
p27
I1
sVframes
p28
(lp29
(dp30
Vfilename
p31
V??
p32
sVline
p33
L18446744073709551615L
sVname
p34
Vc10::cuda::CUDACachingAllocator
p35
sa(dp36
g31
Vtrain.py
p37
sg33
I7
sg34
Vstep
p38
sasa(dp39
g24
Voom
p40
sVdevice_free
p41
I1024
sg14
L1099511627776L
sg7
I0
sg27
I2
sg28
g29
sa(dp42
g24
Vfree_requested
p43
sg26
L139637976728064L
sg14
I1024
sg7
I0
sg27
I3
sg28
g29
sa(dp44
g24
Vfree_completed
p45
sg26
L139637976728064L
sg14
I1024
sg7
I0
sg27
I3
sg28
g29
sa(dp46
g24
Vsnapshot
p47
sg26
I0
sg14
I0
sg7
I0
sg27
I4
sg28
(lp48
saas.]=])
  elseif(WRITE STREQUAL "stack_global")
    # PROTO 4, EMPTY_DICT, MARK, 'segments', then 'os' and 'system' (SHORT_BINUNICODE, its length
    # a byte) named by STACK_GLOBAL and called by REDUCE on a TUPLE1, then SETITEMS and STOP.
    string(ASCII 128 4 proto)
    string(ASCII 140 8 key)
    string(ASCII 140 2 module)
    string(ASCII 140 6 name)
    string(ASCII 147 stack_global)
    string(ASCII 140 30 argument)
    string(ASCII 133 tuple1)
    file(WRITE "${TRACE}" "${proto}}(${key}segments${module}os${name}system${stack_global}"
                          "${argument}touch carve_replay_was_tricked${tuple1}Ru.")
  else()
    message(FATAL_ERROR "replay_test.cmake: no snapshot '${WRITE}' to write")
  endif()
endif()
if(NOT EXISTS "${TRACE}")
  message("skipped: ${TRACE} is absent")
  return()
endif()
if(NOT DEFINED EXIT_CODE OR EXIT_CODE STREQUAL "")
  set(EXIT_CODE 0)
endif()
execute_process(COMMAND ${REPLAY} ${TRACE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(EXISTS carve_replay_was_tricked)
  message(FATAL_ERROR "a pickle's call ran: carve_replay_was_tricked exists")
endif()
if(NOT rc EQUAL EXIT_CODE)
  message(FATAL_ERROR "carve_replay exited with ${rc}, not ${EXIT_CODE}")
endif()
if(NOT EXIT_CODE EQUAL 0)
  set(out "${out}${err}")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT "${out}" MATCHES "${re}")
    message(FATAL_ERROR "the output does not say '${re}'")
  endif()
endforeach()
foreach(re IN LISTS FORBID)
  if("${out}" MATCHES "${re}")
    message(FATAL_ERROR "the output says '${re}'")
  endif()
endforeach()
