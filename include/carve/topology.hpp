/// @file carve/topology.hpp
/// The machine's cards and links: readers for nvidia-smi text and descriptions,
/// path bandwidths.
///
/// Host-only. discover_topology() needs the CUDA runtime (see cuda_discovery.hpp).
#pragma once

#include <carve/topology/cuda_discovery.hpp>
#include <carve/topology/description.hpp>
#include <carve/topology/gpu_links.hpp>
#include <carve/topology/graph.hpp>
#include <carve/topology/nvidia_smi.hpp>
#include <carve/topology/parse_error.hpp>
#include <carve/topology/text_lines.hpp>
#include <carve/topology/topology.hpp>
