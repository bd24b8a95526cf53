/// @file carve/service.hpp
/// The allocation service: carve-served's AllocationServer and the applications'
/// AllocationClient.
///
/// Host-only, Linux (Unix sockets, memfd, epoll, SO_PEERCRED). Where `<cuda_runtime_api.h>` is on
/// the include path a client can map CUDA IPC memory (link CUDA::cudart then, or define
/// CARVE_SERVICE_NO_CUDA).
#pragma once

#if defined(__linux__)
#include <carve/service/allocation_client.hpp>
#include <carve/service/allocation_server.hpp>
#include <carve/service/allocation_service.hpp>
#include <carve/service/client_mappings.hpp>
#include <carve/service/client_transport.hpp>
#include <carve/service/descriptor_reserve.hpp>
#include <carve/service/event_loop.hpp>
#include <carve/service/leased_upstream.hpp>
#include <carve/service/protocol.hpp>
#include <carve/service/protocol_layout.hpp>
#include <carve/service/protocol_messages.hpp>
#include <carve/service/reclaim_waits.hpp>
#include <carve/service/reply_queue.hpp>
#include <carve/service/segment_devices.hpp>
#include <carve/service/segment_mapping.hpp>
#include <carve/service/server_config.hpp>
#include <carve/service/server_options.hpp>
#include <carve/service/service_report.hpp>
#include <carve/service/shared_memory_card.hpp>
#include <carve/service/unix_socket.hpp>
#include <carve/service/wire.hpp>
#endif
