/// @file carve/slot/policy/last_fit.hpp
/// LastFit, the highest start that fits: EndFit<SlotEnd::last>, defined in end_fit.hpp beside
/// FirstFit (this header stays so that code including it compiles unchanged).
#pragma once

#include <carve/slot/policy/end_fit.hpp>
