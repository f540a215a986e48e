// The arena stash for Python: spillarena.checkpoint keeps each layer input's bytes here between
// forward and backward. Only handles cross into Python, and tensors cross as DLPack capsules,
// so this extension links no torch (Note [The stash moves bytes] in src/core/stash/buffer.cc);
// python/spillarena/stash.py wraps these in the TensorStash a user sees.
#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "capsules.h"
#include "core/stash/chain.h"
#include "device_engine.h"
#include "fields.h"

namespace spillarena_python {
namespace {

using spill::detail::Chain;
using spill::detail::EntryPtr;

// Note [Letting go of the stash without the GIL]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The stash's threads let go of Python's tensors: a write completes on the progress thread and
// the input's DLPack owner is released there, which takes the GIL when it was the tensor's last
// reference. A chain's destructor joins that thread, and an entry's waits for its I/O; run
// under the GIL — a Python object dying — they would wait for a thread that waits for the GIL.
// So whatever Python drops of the stash is destroyed with the GIL released. The same holds for
// the arena's mutex: the stash never calls the engine (which takes the GIL) while holding it
// (DevicePath::pool_for), and the bindings release the GIL before taking it.
template <class Release>
void without_gil(Release release) {
  if (PyGILState_Check() != 0) {
    py::gil_scoped_release unlocked;
    release();
  } else {
    release();
  }
}

// `chain` whose last reference, wherever Python drops it, is released without the GIL.
std::shared_ptr<Chain> held_by_python(std::shared_ptr<Chain> chain) {
  Chain* raw = chain.get();
  return std::shared_ptr<Chain>(
      raw, [chain = std::move(chain)](Chain*) mutable { without_gil([&] { chain.reset(); }); });
}

// One stored input, as Python holds it. restore() may run once (a second backward through the
// same graph must fail, not read a freed region); free() frees an unrestored region at once.
// One handle may be used from several Python threads (the GIL is released around the calls):
// a mutex serialises them, so free() waits for a restore in flight and a second caller gets
// CheckpointError, never a freed entry.
class Stored {
 public:
  Stored(std::shared_ptr<Chain> chain, EntryPtr entry)
      : chain_(std::move(chain)), entry_(std::move(entry)) {}
  Stored(Stored&&) = default;
  ~Stored() {
    without_gil([this] { entry_.reset(), chain_.reset(); });
  }

  spill::detail::Buffer restore() {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (restored_ || !entry_) {
      throw spill::CheckpointError(
          "spillarena: this stashed tensor was already restored (or freed); its region was "
          "consumed. Run forward again for a new graph (retain_graph is not supported with "
          "spilled inputs)");
    }
    restored_ = true;
    return chain_->restore(entry_);
  }
  void prefetch() {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (!entry_ || restored_) return;
    spill::detail::MutexLock entry_lock(entry_->mutex);
    chain_->prefetch(*entry_);
  }
  void free() {
    std::lock_guard<std::mutex> lock(*mutex_);
    entry_.reset();
  }
  bool restored() const {
    std::lock_guard<std::mutex> lock(*mutex_);
    return restored_;
  }

 private:
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();  // guards the three below
  std::shared_ptr<Chain> chain_;
  EntryPtr entry_;
  bool restored_ = false;
};

// Note [The arena's warnings reach Python as warnings]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The chain collects its warnings (the first overflow, a refused grow: Note [Growing the arena]
// in src/core/arena/arena_growth.cc; a pageable host pool) instead of printing them. After each
// store, with the GIL, they are raised as spillarena.SpillArenaWarning, so
// warnings.filterwarnings and pytest.warns see them; a filter that turns them into errors raises
// from store().
void warn_in_python(Chain& chain) {
  std::vector<std::string> notices;
  {
    py::gil_scoped_release release;  // the arena's mutex, which the engine never waits under
    notices = chain.take_notices();
  }
  if (notices.empty()) return;
  const py::object category = py::module_::import("spillarena.errors").attr("SpillArenaWarning");
  for (const std::string& notice : notices) {
    // stacklevel 2: the warning points at the caller of spillarena.stash's store().
    if (PyErr_WarnEx(category.ptr(), notice.c_str(), 2) != 0) throw py::error_already_set();
  }
}

// store(bytes, accelerator, describe): `bytes` the capsule of the input's contiguous bytes.
Stored store(const std::shared_ptr<Chain>& chain, py::handle bytes, bool accelerator,
             std::string describe) {
  spill::detail::StashInput in;
  in.bytes = buffer_of(bytes);
  in.accelerator = accelerator;
  if (accelerator) in.engine = python_engine_for_inputs();
  in.describe = [text = std::move(describe)] { return text; };
  EntryPtr e;
  {
    py::gil_scoped_release release;
    chain->rethrow_failure();
    e = std::make_shared<spill::detail::Entry>(std::move(in), chain->counters());
    chain->stored(e);
  }
  warn_in_python(*chain);
  return Stored(chain, std::move(e));
}

py::object restore(Stored& stored) {
  spill::detail::Buffer bytes;
  {
    py::gil_scoped_release release;
    bytes = stored.restore();
  }
  if (!bytes.defined()) return py::none();
  return capsule_of(bytes);
}

}  // namespace

void bind_stash(py::module_& m) {
  using Release = py::call_guard<py::gil_scoped_release>;
  close_python_at_exit();

  py::class_<Stored>(m, "_Stored", "A layer input's bytes in the chain; restore() once.")
      .def("restore", &restore,
           "The stored bytes as a DLPack capsule (1-D uint8). Once only; CheckpointError after "
           "restore() or free().")
      .def("prefetch", &Stored::prefetch, Release(),
           "Starts bringing the bytes back without waiting; restore() then finds them ready.")
      .def("free", &Stored::free, Release(), "Free the stored bytes now.")
      .def_property_readonly("restored", py::cpp_function(&Stored::restored, Release()));

  py::class_<Chain, std::shared_ptr<Chain>> chain(
      m, "_Chain", "The arena stash's chain of stored inputs (spillarena.stash wraps it).");
  share_on_copy(chain, "TensorStash");
  chain.def("store", &store, py::arg("bytes"), py::arg("accelerator"), py::arg("describe"))
      .def_property_readonly("name",
                             [](const Chain& c) { return spill::to_string(c.arena().backing()); })
      .def(
          "stats",
          [](const Chain& c) {
            spill::StashStats stats;
            {
              py::gil_scoped_release release;  // the arena's mutex
              stats = c.stats();
            }
            return to_dict(stats);
          },
          "A dict keyed by spill::StashStats field names.");

  m.def(
      "_make_chain",
      [](const spill::SpillArena& arena, const py::kwargs& options) {
        spill::StashOptions parsed;
        {
          py::gil_scoped_release release;  // the arena's mutex
          parsed = spill::stash_options(arena);
        }
        for (const auto& [key, value] : options) set_field(parsed, key.cast<std::string>(), value);
        py::gil_scoped_release release;
        return held_by_python(spill::detail::make_chain(arena, parsed));
      },
      py::arg("arena"),
      "A chain of its own in the regions of `arena`. Keywords as in spill::StashOptions "
      "(asynchronous, prefetch_depth, keep_last, gds_buffer_bytes); by default the arena's.");
  m.def(
      "_shared_chain",
      [](const spill::SpillArena& arena) {
        py::gil_scoped_release release;  // the arena's mutex
        return held_by_python(spill::detail::shared_chain(arena));
      },
      py::arg("arena"),
      "The arena's shared chain, as spill::checkpoint uses it: consecutive layers form one "
      "chain for prefetching and keep_last.");
}

}  // namespace spillarena_python
