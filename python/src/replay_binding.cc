// The forward state a recomputation replays (RNG and autocast), from the C++ layer, for
// spillarena.checkpoint; and spill::checkpoint itself as a second front end for the tests.
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <vector>

#include "binding.h"
#include "spill/checkpoint.h"
#include "torch_layer/forward_state.h"

namespace spillarena_python {
namespace {

// Note [One replay, two front ends]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// spill::checkpoint (C++) and spillarena.checkpoint (Python: transformers' calling convention,
// kwargs, pytrees of outputs) are two front ends over one stash. What a recomputation must see
// again — the CPU and device generators' states and the autocast state, put back afterwards —
// is captured and replayed by one implementation, spill::detail::ForwardState
// (src/torch_layer/forward_state.cc), which the Python front end's reentrant form reaches
// through _capture_forward_state and _ForwardReplay (its default form is torch's own
// non-reentrant checkpoint, which replays with torch's code: Note [A non-reentrant checkpoint
// that spills] in python/spillarena/non_reentrant.py). _cpp_checkpoint runs the C++ front end on a
// Python layer, so tests/python/test_conformance.py runs one table of cases (dropout, autocast,
// extra tensors and several outputs, the RNG stream after backward, frozen inputs, no grad, a
// forward without backward, a second backward) against both; what only Python has (kwargs,
// pytrees, preserve_rng_state=False) is in test_checkpoint.py. Both say the same words on a
// second backward: kSecondBackwardMessage, bound as _SECOND_BACKWARD_MESSAGE.

// A replay as a Python context manager: installs the state on __enter__, puts back the states
// it found on __exit__.
class ReplayScope {
 public:
  explicit ReplayScope(std::shared_ptr<const spill::detail::ForwardState> state)
      : state_(std::move(state)) {}
  void enter() { replay_.emplace(*state_); }
  void exit() { replay_.reset(); }

 private:
  std::shared_ptr<const spill::detail::ForwardState> state_;
  std::optional<spill::detail::ForwardReplay> replay_;
};

// A Python callable as a spill::Layer. The layer lives in the autograd graph and may be
// destroyed on a thread without the GIL: the callable is released under it.
spill::Layer layer_of(py::function fn) {
  std::shared_ptr<py::function> held(new py::function(std::move(fn)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [held](const std::vector<torch::Tensor>& inputs) {
    py::gil_scoped_acquire gil;
    py::object out = (*held)(*py::cast(inputs));
    if (THPVariable_Check(out.ptr())) return std::vector<torch::Tensor>{out.cast<torch::Tensor>()};
    return out.cast<std::vector<torch::Tensor>>();
  };
}

}  // namespace

void bind_replay(py::module_& m) {
  using State = spill::detail::ForwardState;
  py::class_<State, std::shared_ptr<State>>(m, "_ForwardState",
                                            "RNG and autocast state captured in a forward.");
  m.def(
      "_capture_forward_state",
      [](const std::vector<torch::Tensor>& tensors, bool with_rng) {
        return std::make_shared<State>(spill::detail::capture_forward_state(tensors, with_rng));
      },
      py::arg("tensors"), py::arg("with_rng") = true);
  py::class_<ReplayScope>(m, "_ForwardReplay",
                          "with _ForwardReplay(state): recompute under the forward's state")
      .def(py::init<std::shared_ptr<const State>>())
      .def("__enter__", [](ReplayScope& s) { s.enter(); })
      .def("__exit__", [](ReplayScope& s, py::args) { s.exit(); });
  m.attr("_SECOND_BACKWARD_MESSAGE") = spill::detail::kSecondBackwardMessage;
  m.def(
      "_cpp_checkpoint",
      [](const std::shared_ptr<spill::TensorStash>& stash, py::function layer,
         std::vector<torch::Tensor> inputs) {
        return spill::checkpoint(*stash, layer_of(std::move(layer)), std::move(inputs));
      },
      "spill::checkpoint(stash, layer, inputs) on a Python layer (tests: the C++ front end)");
}

}  // namespace spillarena_python
