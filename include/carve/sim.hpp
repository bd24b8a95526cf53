/// @file carve/sim.hpp
/// The workgroup scheduling simulator (host only).
///
/// Replays workgroup queues on any workload: a FIFO dispatcher places workgroups on
/// compute units whose slots are managed by carve's SlotAllocator under any fit policy, and
/// measures makespan, fragmentation, wear and the allocator's cost against the bound of slots
/// that need not be contiguous. examples/slot_sim is the command-line tool built on it.
#pragma once

#include <carve/sim/compute_unit.hpp>
#include <carve/sim/cost.hpp>
#include <carve/sim/dispatcher.hpp>
#include <carve/sim/distribution.hpp>
#include <carve/sim/input_error.hpp>
#include <carve/sim/kernel_mix.hpp>
#include <carve/sim/random.hpp>
#include <carve/sim/run_result.hpp>
#include <carve/sim/stats.hpp>
#include <carve/sim/sweep.hpp>
#include <carve/sim/text_words.hpp>
#include <carve/sim/trace.hpp>
#include <carve/sim/workload.hpp>
