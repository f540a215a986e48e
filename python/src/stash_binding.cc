// The tensor stash of spill::checkpoint: spillarena.checkpoint keeps each layer input here
// between forward and backward. Only handles cross into Python; the bytes stay in the arena.
#include <torch/extension.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "fields.h"
#include "spill/tensor_stash.h"
#include "torch_layer/shared_arena_stash.h"

namespace spillarena_python {
namespace {

// One stored tensor, as Python holds it. restore() may run once (a second backward through the
// same graph must fail, not read a freed region); free() frees an unrestored region at once.
// One handle may be used from several Python threads (the GIL is released around the calls):
// a mutex serialises them, so free() waits for a restore in flight and a second caller gets
// CheckpointError, never a freed StashedTensor.
class Stashed {
 public:
  explicit Stashed(std::unique_ptr<spill::StashedTensor> inner) : inner_(std::move(inner)) {}

  torch::Tensor restore() {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (restored_ || !inner_) {
      throw spill::CheckpointError(
          "spillarena: this stashed tensor was already restored (or freed); its region was "
          "consumed. Run forward again for a new graph (retain_graph is not supported with "
          "spilled inputs)");
    }
    restored_ = true;
    return inner_->restore();
  }
  void prefetch() {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (inner_ && !restored_) inner_->prefetch();
  }
  void free() {
    std::lock_guard<std::mutex> lock(*mutex_);
    inner_.reset();
  }
  bool restored() const {
    std::lock_guard<std::mutex> lock(*mutex_);
    return restored_;
  }

 private:
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();  // guards the two below
  std::unique_ptr<spill::StashedTensor> inner_;
  bool restored_ = false;
};

// Note [The arena's warnings reach Python as warnings]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The arena stash warns through TORCH_WARN (the first overflow, a refused grow: Note [Growing the
// arena] in src/core/arena/arena_growth.cc). Outside torch's own bindings that goes to stderr,
// where warnings.filterwarnings and pytest.warns cannot see it. store() runs under a c10 warning
// handler of its own (c10's public WarningHandler, per thread, and the GIL is released on this
// thread), and the warnings it collected are raised afterwards, with the GIL, as
// spillarena.SpillArenaWarning; a filter that turns them into errors raises from store().
class CollectWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

Stashed store_warning_in_python(spill::TensorStash& stash, const torch::Tensor& tensor) {
  CollectWarnings collected;
  std::unique_ptr<spill::StashedTensor> stored;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&collected);
    py::gil_scoped_release release;
    stored = stash.store(tensor);
  }
  Stashed result(std::move(stored));
  if (collected.messages.empty()) return result;
  const py::object category = py::module_::import("spillarena.errors").attr("SpillArenaWarning");
  for (const std::string& message : collected.messages) {
    if (PyErr_WarnEx(category.ptr(), message.c_str(), 1) != 0) throw py::error_already_set();
  }
  return result;
}

}  // namespace

void bind_stash(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;

  py::class_<Stashed>(m, "StashedTensor", "A tensor held by a stash; restore() gives it back once.")
      .def("restore", &Stashed::restore, Release(),
           "The stored tensor (same values, shape, dtype, device; contiguous). Once only.")
      .def("prefetch", &Stashed::prefetch, Release(),
           "Starts bringing the tensor back without waiting; restore() then finds it ready.")
      .def("free", &Stashed::free, Release(), "Free the stored bytes now.")
      .def_property_readonly("restored", &Stashed::restored);

  py::class_<spill::TensorStash, std::shared_ptr<spill::TensorStash>> stash(
      m, "TensorStash",
      "Where spillarena.checkpoint keeps layer inputs between forward and backward. Copies share "
      "it; it cannot be pickled.");
  share_on_copy(stash, "TensorStash");
  stash
      .def("store", &store_warning_in_python, py::arg("tensor"),
           "Keeps the tensor in the stash (spilled to the arena once keep_last newer ones were "
           "stored). An input that finds no room stays in memory (when_full='keep_in_memory', "
           "with one SpillArenaWarning per arena) or raises ArenaExhaustedError "
           "(when_full='error').")
      .def_property_readonly("name", &spill::TensorStash::name)
      .def(
          "stats", [](const spill::TensorStash& s) { return to_dict(s.stats()); },
          "A dict keyed by spill::StashStats field names (zeros for stashes without an arena).");

  m.def(
      "make_arena_stash",
      [](const spill::SpillArena& arena, const py::kwargs& options) {
        spill::StashOptions parsed = spill::stash_options(arena);
        for (const auto& [key, value] : options) set_field(parsed, key.cast<std::string>(), value);
        return spill::make_arena_stash(arena, parsed);
      },
      py::arg("arena"),
      "A stash of its own in the regions of `arena` (it keeps the arena alive). Keywords as in "
      "spill::StashOptions (asynchronous, prefetch_depth, keep_last, gds_buffer_bytes); by "
      "default the arena's.");
  m.def(
      "shared_arena_stash",
      [](const spill::SpillArena& arena) { return spill::detail::shared_arena_stash(arena); },
      py::arg("arena"),
      "The arena's shared stash, as spill::checkpoint uses it: consecutive layers form one "
      "chain for prefetching and keep_last.");
  m.def("make_in_memory_stash", &spill::make_in_memory_stash,
        "Keeps a reference to the input: classic gradient checkpointing, nothing spilled.");
  m.def(
      "make_per_file_stash",
      [](py::handle directory) {
        return spill::make_per_file_stash(
            Convert<std::string>::from_python(directory, "make_per_file_stash: directory"));
      },
      py::arg("directory"),
      "One torch.save file per tensor (str, bytes or os.PathLike directory): the baseline "
      "spillarena replaces.");
}

}  // namespace spillarena_python
