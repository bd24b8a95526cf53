/// @file carve/tier.hpp
/// Spill tiers shared fairly among GPUs: the planner, its reports, discovery, and the
/// resources that back a plan.
///
/// Host-only (Linux). NumaNodeResource needs libnuma when used (link carve::numa).
#pragma once

#include <carve/tier/byte_size.hpp>
#include <carve/tier/gpu_spill.hpp>
#include <carve/tier/spill_tier.hpp>
#include <carve/tier/tier_discovery.hpp>
#include <carve/tier/tier_planner.hpp>
#include <carve/tier/tier_report.hpp>
#include <carve/tier/tier_resources.hpp>
#include <carve/tier/tier_share_resource.hpp>
