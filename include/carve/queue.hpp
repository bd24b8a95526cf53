/// @file carve/queue.hpp
/// Requests queued by size: SizeTieredQueue, its lanes and its drain policies.
///
/// Host and device lanes; blocking calls are host-only.
#pragma once

#include <carve/queue/backoff.hpp>
#include <carve/queue/blocking_calls.hpp>
#include <carve/queue/bounded_count.hpp>
#include <carve/queue/deficit_round_robin.hpp>
#include <carve/queue/drain_policy.hpp>
#include <carve/queue/drain_view.hpp>
#include <carve/queue/lane.hpp>
#include <carve/queue/moodycamel_lane.hpp> // only when moodycamel's header is found (CARVE_HAS_MOODYCAMEL_LANE)
#include <carve/queue/mpmc_ring.hpp>
#include <carve/queue/poll_backoff.hpp>
#include <carve/queue/priority_tag.hpp>
#include <carve/queue/push_gate.hpp>
#include <carve/queue/queue_clock.hpp>
#include <carve/queue/queue_stats.hpp>
#include <carve/queue/queue_wait_stats.hpp>
#include <carve/queue/queue_waiters.hpp>
#include <carve/queue/round_robin.hpp>
#include <carve/queue/size_tiered_queue.hpp>
#include <carve/queue/strict_priority.hpp>
#include <carve/queue/tier_thresholds.hpp>
#include <carve/queue/tiered_lanes.hpp>
#include <carve/queue/weighted_round_robin.hpp>
