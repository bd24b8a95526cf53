/// @file carve/core.hpp
/// The pieces every carve component uses: bit operations, errors, configuration.
///
/// Host and device.
#pragma once

#include <carve/core/asymmetric_fence.hpp>
#include <carve/core/bits.hpp>
#include <carve/core/checked_math.hpp>
#include <carve/core/compressed_pair.hpp>
#include <carve/core/config.hpp>
#include <carve/core/cpu_pause.hpp>
#include <carve/core/errc.hpp>
#include <carve/core/error.hpp>
#include <carve/core/format_bytes.hpp>
#include <carve/core/heap_array.hpp>
#include <carve/core/misuse.hpp>
#include <carve/core/os_page_size.hpp>
#include <carve/core/system_refusal.hpp>
#include <carve/core/thread_number.hpp>
