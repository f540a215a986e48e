// The number of fields of an aggregate, at compile time, and a check that a `visit_fields` names
// each of them once, in order: a field added to a struct and forgotten in its list (and so in the
// CLI's JSON and the Python dicts and keywords made from it) fails a test. See Note [One list of
// each struct's fields] in src/core/stash/stash_fields.h.
//
//   struct Point { int x = 0; int y = 0; };
//   static_assert(spill_test::field_count<Point>() == 2);
//   spill_test::check_visits_every_field(spill::ArenaStats{}, [](const auto& s, auto&& visit) {
//     spill::detail::visit_fields(s, visit);  // core/arena/arena_fields.h
//   });
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

namespace spill_test {
namespace detail {

// Converts to any field's type; only named in unevaluated operands.
struct AnyField {
  template <class T>
  operator T() const noexcept;
};
template <std::size_t>
using AnyFieldAt = AnyField;

template <class T, class Indices, class = void>
struct InitializableFrom : std::false_type {};
template <class T, std::size_t... I>
struct InitializableFrom<T, std::index_sequence<I...>, std::void_t<decltype(T{AnyFieldAt<I>{}...})>>
    : std::true_type {};

}  // namespace detail

// An aggregate (no base classes, no array fields) takes at most one initializer per field, and
// fewer when the others have defaults: its field count is the most initializers T{...} accepts.
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
  static_assert(std::is_aggregate_v<T>);
  if constexpr (detail::InitializableFrom<T, std::make_index_sequence<N + 1>>::value) {
    return field_count<T, N + 1>();
  } else {
    return N;
  }
}

// visit_fields(object, visit) calls visit once per field of `object`, in declaration order: as
// many calls as fields, each with a field of its own (inside `object`, after the one before) and
// a name of its own. The caller passes the visit_fields to check (the library's are internal, in
// spill::detail: not found by argument-dependent lookup).
template <class T, class VisitFields>
void check_visits_every_field(const T& object, VisitFields&& visit_fields) {
  const char* begin = reinterpret_cast<const char*>(&object);
  std::set<const void*> fields;
  std::set<std::string> names;
  std::size_t visits = 0;
  const char* previous = nullptr;
  visit_fields(object, [&](const char* name, const auto& field) {
    const char* at = reinterpret_cast<const char*>(&field);
    const std::string named = name;  // CAPTURE would log a const char* as its address
    CAPTURE(named);
    CHECK((at >= begin && at < begin + sizeof(T)));
    CHECK((previous == nullptr || at > previous));  // members are laid out in declaration order
    previous = at;
    fields.insert(&field);
    names.insert(name);
    ++visits;
  });
  CHECK(visits == field_count<T>());
  CHECK(fields.size() == visits);
  CHECK(names.size() == visits);
}

}  // namespace spill_test
