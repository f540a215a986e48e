// spillarena's LibTorch warnings (TORCH_WARN), collected on this thread for a scope.
//
//   spill_test::SpillarenaWarnings warnings;
//   ...  // a step that may warn
//   REQUIRE(warnings.messages.size() == 1);
//
// A test counts spillarena's own warnings, each of which begins "spillarena: ", never LibTorch's:
// those depend on LibTorch's version and on the CPU it runs on. LibTorch's go on to the handler
// that was installed before, so they are still printed.
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace spill_test {

class SpillarenaWarnings final : public c10::WarningHandler {
 public:
  SpillarenaWarnings() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~SpillarenaWarnings() override { c10::WarningUtils::set_warning_handler(previous_); }
  SpillarenaWarnings(const SpillarenaWarnings&) = delete;
  SpillarenaWarnings& operator=(const SpillarenaWarnings&) = delete;

  void process(const c10::Warning& warning) override {
    if (warning.msg().rfind("spillarena: ", 0) == 0) {
      messages.push_back(warning.msg());
    } else {
      previous_->process(warning);
    }
  }

  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

}  // namespace spill_test
