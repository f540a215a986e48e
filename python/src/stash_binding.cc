// The arena stash for Python: spillarena.checkpoint keeps each layer input's bytes here between
// forward and backward. Only handles cross into Python, and tensors cross as DLPack capsules,
// so this extension links no torch (Note [The stash moves bytes] in src/core/stash/buffer.cc);
// python/spillarena/chain.py wraps these, arena_stash.py in the TensorStash a user sees.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "capsules.h"
#include "core/stash/chain.h"
#include "core/stash/stored_bytes.h"
#include "device_engine.h"
#include "fields.h"
#include "python_call.h"
#include "spill/stash.h"

namespace spillarena_python {
namespace {

using spill::detail::Chain;
using ChainPtr = std::shared_ptr<Chain>;
// One stored input, as Python holds it: the stash protocol's handle (restore once, in-place
// check; Note [One stash protocol, two front ends] in src/core/stash/stored_bytes.cc).
using Stored = spill::detail::StoredBytes;

}  // namespace

template <>
struct CapsuleName<ChainPtr> {
  static constexpr const char* value = "spillarena._Chain";
};
template <>
struct CapsuleName<Stored> {
  static constexpr const char* value = "spillarena._Stored";
};

namespace {

// Note [Letting go of the stash without the GIL]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The stash's threads let go of Python's tensors: a write completes on the progress thread and
// the input's DLPack owner is released there, which takes the GIL when it was the tensor's last
// reference (a write made at once, up to 512 KiB, lets it go inside store(), which runs with the
// GIL released: Note [A small write is made at once] in src/core/arena/arena_core.cc). A chain's
// destructor joins that thread, and an entry's waits for its I/O; run under the GIL — a Python
// object dying — they would wait for a thread that waits for the GIL. So whatever Python drops of
// the stash is destroyed with the GIL released (the capsules of Note [C++ objects Python holds]).
// The same holds for the arena's mutex: the stash never calls the engine (which takes the GIL)
// while holding it (DevicePath::pool_for), and the bindings release the GIL before taking it.
// So the order is always the stash's mutexes (a handle's, an entry's), then the GIL: the
// version watch of changed_since is read with an entry's mutex held, and an entry's last owner
// — any stash thread — lets go of the watch under the GIL. Two rules follow: no binding waits
// for a stash mutex or thread while it holds the GIL, and nothing joins a stash thread under it.

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
    Unlocked unlocked;  // the arena's mutex, which the engine never waits under
    notices = chain.take_notices();
  }
  if (notices.empty()) return;
  const Ref category =
      Ref::steal(PyImport_ImportModule("spillarena.errors")).attr("SpillArenaWarning");
  for (const std::string& notice : notices) {
    // stacklevel 3: past chain.py's Chain.store and arena_stash.py's _ArenaStash.store, at their
    // caller.
    if (PyErr_WarnEx(category.get(), notice.c_str(), 3) != 0) throw PythonError();
  }
}

ChainPtr& chain_of(PyObject* handle) { return held<ChainPtr>(handle); }

// Autograd's rule for saved tensors, through the front end's watch (an object whose _version is
// the input's: Note [A version kept without the bytes] in python/spillarena/version_watch.py):
// true once it moved past `version`. The chain asks with the GIL released, from the thread
// that stores or restores; the watch is read, and let go, under the GIL.
std::function<bool()> changed_since(PyObject* watch, PyObject* version) {
  const auto at = Convert<std::int64_t>::from_python(version, "store: version");
  auto held_watch = std::make_shared<AnyThreadRef>(AnyThreadRef::adopt(Py_NewRef(watch)));
  return [held_watch, at] {
    PythonCall call;
    if (!call) return false;  // the interpreter is ending: nothing is restored any more
    const Ref now = Ref::borrow(held_watch->get()).attr("_version");
    return Convert<std::int64_t>::from_python(now.get(), "store: version") != at;
  };
}

// _make_chain(arena, options): a chain of its own; options as in spill::StashOptions.
PyObject* make_chain(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 2, "_make_chain");
    const spill::SpillArena& arena = held<spill::SpillArena>(a[0]);
    spill::StashOptions parsed;
    {
      Unlocked unlocked;  // the arena's mutex
      parsed = spill::stash_options(arena);
    }
    for_each_item(a[1], "make_arena_stash: options",
                  [&](const std::string& key, PyObject* value) { set_field(parsed, key, value); });
    ChainPtr chain;
    {
      Unlocked unlocked;
      chain = spill::detail::make_chain(arena, parsed);
    }
    return hold(std::move(chain));
  });
}

PyObject* shared_chain(PyObject*, PyObject* arena) {
  return guarded([&] {
    const spill::SpillArena& a = held<spill::SpillArena>(arena);
    ChainPtr chain;
    {
      Unlocked unlocked;  // the arena's mutex
      chain = spill::detail::shared_chain(a);
    }
    return hold(std::move(chain));
  });
}

// _chain_store(chain, bytes, accelerator, describe, layer_input, watch, version): `bytes` the
// capsule of the input's contiguous bytes; layer_input false counts it in saved_tensors_*;
// `watch._version` moving past `version` refuses the input as changed in place.
PyObject* store(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 7, "_chain_store");
    const ChainPtr& chain = chain_of(a[0]);
    spill::detail::StashInput in;
    in.accelerator = Convert<bool>::from_python(a[2], "store: accelerator");
    in.describe = [text = utf8(a[3], "store: describe")] { return text; };
    in.layer_input = Convert<bool>::from_python(a[4], "store: layer_input");
    in.changed_in_place = changed_since(a[5], a[6]);
    in.bytes = buffer_of(a[1]);
    if (in.accelerator) in.engine = python_engine_for_inputs();
    std::optional<Stored> stored_bytes;
    {
      Unlocked unlocked;
      stored_bytes.emplace(Stored::store(chain, std::move(in)));
    }
    Ref stored = hold(std::move(*stored_bytes));
    warn_in_python(*chain);
    return stored;
  });
}

PyObject* chain_name(PyObject*, PyObject* chain) {
  return guarded(
      [&] { return message_to_python(spill::to_string(chain_of(chain)->arena().backing())); });
}

PyObject* chain_stats(PyObject*, PyObject* chain) {
  return guarded([&] {
    const ChainPtr& c = chain_of(chain);
    spill::StashStats stats;
    {
      Unlocked unlocked;  // the arena's mutex
      stats = c->stats();
    }
    return to_dict(stats);
  });
}

PyObject* restore(PyObject*, PyObject* handle) {
  return guarded([&] {
    Stored& stored = held<Stored>(handle);
    spill::detail::Buffer bytes;
    {
      Unlocked unlocked;
      bytes = stored.restore();
    }
    return bytes.defined() ? capsule_of(bytes) : Ref::borrow(Py_None);
  });
}

// _stored_prefetch, _stored_free: `method` of the handle's Stored, the GIL released; None.
template <void (Stored::*method)()>
PyObject* call_unlocked(PyObject*, PyObject* handle) {
  return guarded([&] {
    Stored& stored = held<Stored>(handle);
    {
      Unlocked unlocked;
      (stored.*method)();
    }
    return Ref::borrow(Py_None);
  });
}

// A sequence of ints (a torch.Size, a tuple) as int64s; InvalidArgumentError naming `what`.
std::vector<std::int64_t> int64s(PyObject* sequence, const char* what) {
  const Py_ssize_t n = PySequence_Size(sequence);
  if (n < 0) {
    clear_bad_argument();
    throw_bad_value(what, "a sequence of integers", sequence);
  }
  std::vector<std::int64_t> out;
  for (Py_ssize_t i = 0; i < n; ++i) {
    out.push_back(Convert<std::int64_t>::from_python(
        Ref::steal(PySequence_GetItem(sequence, i)).get(), what));
  }
  return out;
}

// _strides_to_keep(sizes, strides): the strides a restore rebuilds (a tuple), or None for
// contiguous (spill::detail::strides_to_keep).
PyObject* strides_to_keep(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 2, "_strides_to_keep");
    const std::vector<std::int64_t> kept = spill::detail::strides_to_keep(
        int64s(a[0], "_strides_to_keep: sizes"), int64s(a[1], "_strides_to_keep: strides"));
    if (kept.empty()) return Ref::borrow(Py_None);
    Ref out = Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(kept.size())));
    for (std::size_t i = 0; i < kept.size(); ++i) {
      PyTuple_SetItem(out.get(), static_cast<Py_ssize_t>(i),
                      Convert<std::int64_t>::to_python(kept[i]).release());
    }
    return out;
  });
}

PyObject* restored(PyObject*, PyObject* handle) {
  return guarded([&] {
    Stored& stored = held<Stored>(handle);
    bool answer = false;
    {
      Unlocked unlocked;  // a restore in flight holds the handle's mutex
      answer = stored.restored();
    }
    return Convert<bool>::to_python(answer);
  });
}

}  // namespace

void add_stash() {
  add_function("_make_chain", make_chain, METH_VARARGS,
               "_make_chain(arena, options): a chain of its own in the regions of `arena`; "
               "options as in spill::StashOptions, by default the arena's.");
  add_function("_shared_chain", shared_chain, METH_O,
               "_shared_chain(arena): the arena's shared chain, as spill::checkpoint uses it.");
  add_function("_chain_store", store, METH_VARARGS,
               "_chain_store(chain, bytes, accelerator, describe, layer_input, watch, version): "
               "a stored input's handle.");
  add_function("_strides_to_keep", strides_to_keep, METH_VARARGS,
               "_strides_to_keep(sizes, strides): the strides a restore rebuilds, or None.");
  add_function("_chain_name", chain_name, METH_O, "The chain's arena backing: 'disk' or 'ram'.");
  add_function("_chain_stats", chain_stats, METH_O,
               "A dict keyed by spill::StashStats field names.");
  add_function("_stored_restore", restore, METH_O,
               "The stored bytes as a DLPack capsule (1-D uint8). Once only; CheckpointError "
               "after restore or free.");
  add_function("_stored_prefetch", call_unlocked<&Stored::prefetch>, METH_O,
               "Starts bringing the bytes back without waiting.");
  add_function("_stored_free", call_unlocked<&Stored::free>, METH_O, "Frees the stored bytes now.");
  add_function("_stored_restored", restored, METH_O, "Whether restore ran.");
  add_constant("_ALREADY_RESTORED", message_to_python(spill::detail::kAlreadyRestored));
}

}  // namespace spillarena_python
