/// @file carve/slot/policy/first_fit.hpp
/// FirstFit, the lowest start that fits: EndFit<SlotEnd::first>, defined in end_fit.hpp beside
/// LastFit (this header stays so that code including it compiles unchanged).
#pragma once

#include <carve/slot/policy/end_fit.hpp>
