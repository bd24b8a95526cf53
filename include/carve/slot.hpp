/// @file carve/slot.hpp
/// Slots on a compute unit: bitmaps and their searches, fit policies, the
/// allocators (one owner, lock-free shared, sharded, sized at run time), warp- and block-cooperative
/// searches, and placing batches of workgroups.
///
/// Host and device.
#pragma once

#include <carve/slot/allocator/concurrent_slot_allocator.hpp>
#include <carve/slot/allocator/dynamic_slot_allocator.hpp>
#include <carve/slot/allocator/sharded_slot_allocator.hpp>
#include <carve/slot/allocator/slot_allocator.hpp>
#include <carve/slot/allocator/slot_source.hpp>
#include <carve/slot/batch/batch_placement.hpp>
#include <carve/slot/batch/cu_choice.hpp>
#include <carve/slot/cooperative/warp_allocate.hpp>
#include <carve/slot/cooperative/warp_scan.hpp>
#include <carve/slot/policy/best_fit.hpp>
#include <carve/slot/policy/boundary_nearest_fit.hpp>
#include <carve/slot/policy/end_fit.hpp>
#include <carve/slot/policy/fit_policy.hpp>
#include <carve/slot/policy/hinted_fit_policy.hpp>
#include <carve/slot/policy/release_aligned_fit.hpp>
#include <carve/slot/policy/run_time_predictor.hpp>
#include <carve/slot/search/free_runs.hpp>
#include <carve/slot/search/run_search.hpp>
#include <carve/slot/search/run_segment.hpp>
#include <carve/slot/storage/atomic_words.hpp>
#include <carve/slot/storage/lazy_snapshot.hpp>
#include <carve/slot/storage/slot_bitmap.hpp>
#include <carve/slot/storage/slot_range.hpp>
#include <carve/slot/storage/slot_words.hpp>
#include <carve/slot/storage/word_fingerprint.hpp>
#include <carve/slot/storage/word_source.hpp>

// Batch placement kernels and their launchers: only under a CUDA compiler.
#if defined(__CUDACC__)
#include <carve/slot/batch/batch_kernels.cuh>
#endif
