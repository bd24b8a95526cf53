/// @file carve/trace.hpp
/// Allocation traces: a program's allocations and frees as a request stream to replay through any
/// allocator (AllocationTrace, TraceBuilder), read from PyTorch memory snapshots (through a pickle
/// reader that executes nothing), RMM's logging adaptor CSV and carve's own CSV, which
/// carve::TraceResource writes. Host only.
#pragma once

#include <carve/trace/allocation_trace.hpp>
#include <carve/trace/carve_csv.hpp>
#include <carve/trace/memory_snapshot.hpp>
#include <carve/trace/pickle_document.hpp>
#include <carve/trace/pickle_reader.hpp>
#include <carve/trace/pickle_text.hpp>
#include <carve/trace/rmm_log.hpp>
#include <carve/trace/trace_file.hpp>
