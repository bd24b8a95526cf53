/// @file carve/borrow.hpp
/// Memory borrowed across GPUs by link bandwidth: the picker, its strategies, and
/// BorrowingAllocator.
///
/// Host-only.
#pragma once

#include <carve/borrow/any_strategy.hpp>
#include <carve/borrow/bandwidth_weighted_picker.hpp>
#include <carve/borrow/borrow_history.hpp>
#include <carve/borrow/borrowing_allocator.hpp>
#include <carve/borrow/cuda_peer_access.hpp>
#include <carve/borrow/lending_peers.hpp>
#include <carve/borrow/peer_access.hpp>
#include <carve/borrow/pick_strategy.hpp>
#include <carve/borrow/strategies.hpp>
