// What a checkpointed run's results are compared with (issue 49): a test asserts what spillarena
// does, never how LibTorch rounds on one CPU.
//
//   const spill_test::Results<double> ours{{"step 2 loss", 5.62}};       // spilled
//   const spill_test::Results<double> recomputed{{"step 2 loss", 5.62}};  // checkpointed in RAM
//   const spill_test::Results<double> plain{{"step 2 loss", 5.62}};       // no checkpointing
//   spill_test::check_with_references(ours, recomputed, plain);
//   // or the verdict itself: compare_with_references(ours, recomputed, plain).passed()
//
// Checkpointing runs a layer's forward without grad and, in backward, recomputes it and
// backpropagates through the recomputation on its own, so a gradient's contributions may meet in
// another order than in one backward without checkpointing. On some CPUs torch's own checkpoint
// then differs from no checkpointing in the last bits (a Python test failed so). The rule:
//  - ours equals, exactly, a checkpointing reference run in the same process: torch's reentrant
//    recompute (recompute_checkpoint in tests/recompute_reference.h, as LibTorch has no
//    checkpoint function) or spillarena's own checkpoint without spilling (the in-memory stash);
//  - ours equals the run without checkpointing only in the results where that reference equals
//    it, in the same run; where it does not, a MESSAGE names them and nothing fails.
// Equality is transitive, so the second clause adds no failure of its own once the first holds;
// it is checked and reported apart so a failing run says which of the two claims broke.
// Tensors (bit for bit, as torch::equal sees them): RunResults in tests/recompute_reference.h.
// The Python tests keep the same rule: Note [As torch's own checkpoint, and as no checkpointing
// only where torch's own is] in tests/python/conftest.py.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

namespace spill_test {

// One result of a run by name ("loss", "input grad", "step 2 loss"); a run's results come in a
// fixed order.
template <class T>
struct Named {
  std::string name;
  T value;
};
template <class T>
using Results = std::vector<Named<T>>;

// The verdict on one run: the names of the results in each finding.
struct ReferenceCheck {
  bool same_names = true;                           // the three runs name the same results
  std::vector<std::string> ours_differ;             // from the checkpointing reference: a failure
  std::vector<std::string> reference_differs;       // from no checkpointing: torch's, not ours
  std::vector<std::string> compared_with_plain;     // where the reference equals it
  std::vector<std::string> ours_differ_from_plain;  // ... and ours does not: a failure

  bool passed() const {
    return same_names && ours_differ.empty() && ours_differ_from_plain.empty();
  }
};

// `same(a, b)`: whether two results are equal (exactly: operator== by default).
template <class T, class Same = std::equal_to<>>
ReferenceCheck compare_with_references(const Results<T>& ours, const Results<T>& checkpointing,
                                       const Results<T>& plain, Same same = {}) {
  ReferenceCheck r;
  r.same_names = ours.size() == checkpointing.size() && ours.size() == plain.size();
  for (std::size_t i = 0; r.same_names && i < ours.size(); ++i) {
    r.same_names = ours[i].name == checkpointing[i].name && ours[i].name == plain[i].name;
  }
  if (!r.same_names) return r;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const std::string& name = ours[i].name;
    if (!same(ours[i].value, checkpointing[i].value)) r.ours_differ.push_back(name);
    if (!same(checkpointing[i].value, plain[i].value)) {
      r.reference_differs.push_back(name);
      continue;
    }
    r.compared_with_plain.push_back(name);
    if (!same(ours[i].value, plain[i].value)) r.ours_differ_from_plain.push_back(name);
  }
  return r;
}

inline std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The rule as doctest checks: a failure for each broken claim, a MESSAGE naming the results where
// the reference itself differs from no checkpointing on this machine.
inline void check_reference_verdict(const ReferenceCheck& r) {
  REQUIRE_MESSAGE(r.same_names, "the runs compared do not name the same results");
  CHECK_MESSAGE(r.ours_differ.empty(),
                "differ from the checkpointing reference: " << joined(r.ours_differ));
  CHECK_MESSAGE(r.ours_differ_from_plain.empty(),
                "differ from no checkpointing where the checkpointing reference does not: "
                    << joined(r.ours_differ_from_plain));
  if (!r.reference_differs.empty()) {
    MESSAGE(
        "not compared with no checkpointing, from which the checkpointing reference differs "
        "on this machine: "
        << joined(r.reference_differs));
  }
}

template <class T, class Same = std::equal_to<>>
void check_with_references(const Results<T>& ours, const Results<T>& checkpointing,
                           const Results<T>& plain, Same same = {}) {
  check_reference_verdict(compare_with_references(ours, checkpointing, plain, same));
}

}  // namespace spill_test
