// <carve/carve.hpp> — every carve component.
//
// Compiles with any C++20 compiler given CCCL's libcu++ headers. Formatting support for fmt is
// separate: include <carve/fmt.hpp> (and link fmt) to print bitmaps, ranges and errors.
#pragma once

#include <carve/version.hpp>

#include <carve/core/bits.hpp>
#include <carve/core/config.hpp>
#include <carve/core/errc.hpp>

#include <carve/slot/best_fit.hpp>
#include <carve/slot/boundary_nearest_fit.hpp>
#include <carve/slot/first_fit.hpp>
#include <carve/slot/fit_policy.hpp>
#include <carve/slot/free_runs.hpp>
#include <carve/slot/hinted_fit_policy.hpp>
#include <carve/slot/last_fit.hpp>
#include <carve/slot/release_aligned_fit.hpp>
#include <carve/slot/run_search.hpp>
#include <carve/slot/slot_allocator.hpp>
#include <carve/slot/slot_bitmap.hpp>
#include <carve/slot/slot_range.hpp>

// The workgroup scheduling simulator: host-only code over the standard library.
#include <carve/sim.hpp>
