// carve/mr/detail/make_part.hpp — how every combinator builds a part in place: from a tuple of
// the part's constructor arguments after std::piecewise_construct (or cuda::std's, which device
// code uses). The part is never moved, so a pool that cannot move can sit in any stack.
#pragma once

#include <carve/core/config.hpp>

#include <cuda/std/concepts>
#include <cuda/std/tuple>
#include <cuda/std/type_traits>
#include <cuda/std/utility>

#include <tuple>
#include <utility>

namespace carve::detail {

// std::piecewise_construct or cuda::std::piecewise_construct.
template <class Tag>
concept piecewise_tag = cuda::std::same_as<cuda::std::remove_cvref_t<Tag>, cuda::std::piecewise_construct_t> ||
    cuda::std::same_as<cuda::std::remove_cvref_t<Tag>, std::piecewise_construct_t>;

// `R` built from the arguments in `args`.
CARVE_EXEC_CHECK_DISABLE
template <class R, class... A>
CARVE_HOST_DEVICE constexpr R make_part(cuda::std::tuple<A...>&& args) {
  return cuda::std::make_from_tuple<R>(cuda::std::move(args));
}
template <class R, class... A>
constexpr R make_part(std::tuple<A...>&& args) {
  return std::make_from_tuple<R>(std::move(args));
}

// Whether make_part<R> takes `Tuple`.
template <class R, class Tuple>
concept part_arguments = requires(Tuple&& t) {
  make_part<R>(static_cast<Tuple&&>(t));
};

} // namespace carve::detail
