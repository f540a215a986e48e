// spillarena.SpillArena's C++ half (python/spillarena/arena.py is the class), its options and
// stats, and the sizing helpers.
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "fields.h"
#include "spill/arena.h"
#include "spill/directory.h"
#include "spill/io.h"
#include "spill/process_memory.h"
#include "spill/sizing.h"
#include "spill/stash.h"
#include "spill/units.h"

namespace spillarena_python {

namespace {

// Keyword spellings of earlier releases, accepted with a DeprecationWarning.
std::string current_option_name(const std::string& key) {
  if (key != "allow_ram_backed_directory") return key;
  // stacklevel 2: past arena.py's SpillArena.__init__, at its caller.
  if (PyErr_WarnEx(PyExc_DeprecationWarning,
                   "spillarena: allow_ram_backed_directory is now allow_memory_backed_directory",
                   2) != 0) {
    throw PythonError();
  }
  return "allow_memory_backed_directory";
}

// Note [Options the arena does not use]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Some options mean nothing for the backing or I/O mode asked for: the RAM backing has no
// directory and no disk I/O, direct I/O no page cache, buffered I/O no staging pool. Given there,
// they would be ignored silently; a UserWarning names them instead (the arena is still made, as
// the CLI does: see Note [Options a mode does not use] in tools/cli/train_command.cc).
std::string unused_options(const spill::ArenaOptions& o, const std::vector<std::string>& given) {
  auto applies = [&o](const std::string& key) {
    const bool disk = o.backing == spill::Backing::disk;
    if (key == "directory" || key == "allow_memory_backed_directory" ||
        key == "start_writeback_after_write" || key == "io") {
      return disk;
    }
    if (key == "page_cache_limit_bytes") return disk && o.io != spill::IoMode::direct;
    if (key == "staging_bytes") return disk && o.io != spill::IoMode::buffered;
    return true;
  };
  std::string unused;
  for (const std::string& key : given) {
    if (!applies(key)) unused += (unused.empty() ? "" : ", ") + key;
  }
  if (unused.empty()) return "";
  return "spillarena: SpillArena(backing=\"" + std::string(spill::to_string(o.backing)) +
         "\", io=\"" + spill::to_string(o.io) + "\") does not use " + unused +
         "; they are ignored (see spill::ArenaOptions)";
}

// Whether `name` is a field of `Struct` (through spill::detail::visit_fields).
template <class Struct>
bool has_field(const std::string& name) {
  Struct s;
  bool found = false;
  spill::detail::visit_fields(
      s, [&](const char* field, const auto&) { found = found || name == field; });
  return found;
}

// The keywords of SpillArena(...): the arena's options, then its stash's.
const std::vector<std::string>& keyword_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    const auto add = [&out](const char* name, const auto&) { out.emplace_back(name); };
    const spill::ArenaOptions arena;
    const spill::StashOptions stash;
    spill::detail::visit_fields(arena, add);
    spill::detail::visit_fields(stash, add);
    return out;
  }();
  return names;
}

// _arena_new(capacity_bytes, directory, options): SpillArena(...) takes the arena's options
// (spill::ArenaOptions) and those of its stash (spill::StashOptions, kept with the arena by
// spill::set_stash_options) as one set of keywords.
PyObject* make_arena(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 3, "_arena_new");
    spill::ArenaOptions parsed;
    spill::StashOptions stash;
    std::vector<std::string> given;
    set_field(parsed, "capacity_bytes", a[0]);
    if (a[1] != Py_None) {
      set_field(parsed, "directory", a[1]);
      given.push_back("directory");
      if (parsed.directory.empty()) {
        throw spill::InvalidArgumentError(
            "spillarena: directory='': " +
            spill::empty_directory_refusal("pass directory=None or leave it out"));
      }
    }
    for_each_item(a[2], "SpillArena: options", [&](const std::string& key, PyObject* value) {
      // capacity_bytes and directory given twice never get here: Python raises TypeError.
      given.push_back(current_option_name(key));
      if (has_field<spill::StashOptions>(given.back())) {
        set_field(stash, given.back(), value);
      } else {
        set_field(parsed, given.back(), value, keyword_names());
      }
    });
    if (const std::string warning = unused_options(parsed, given); !warning.empty()) {
      if (PyErr_WarnEx(PyExc_UserWarning, warning.c_str(), 2) != 0) throw PythonError();
    }
    std::unique_ptr<spill::SpillArena> arena;
    {
      // Vetting and preallocating the file takes a while; other Python threads may run meanwhile.
      Unlocked unlocked;
      arena = std::make_unique<spill::SpillArena>(parsed);
      spill::set_stash_options(*arena, stash);
    }
    return hold(std::move(*arena));
  });
}

const spill::SpillArena& arena_of(PyObject* handle) { return held<spill::SpillArena>(handle); }

PyObject* stats(PyObject*, PyObject* handle) {
  return guarded([&] {
    const spill::SpillArena& arena = arena_of(handle);
    spill::ArenaStats out;
    {
      Unlocked unlocked;  // the arena's mutex: Note [Letting go of the stash without the GIL]
      out = arena.stats();
    }
    return to_dict(out);
  });
}

PyObject* stash_stats(PyObject*, PyObject* handle) {
  return guarded([&] {
    const spill::SpillArena& arena = arena_of(handle);
    spill::StashStats out;
    {
      Unlocked unlocked;  // the stash's mutex, as in _chain_stats
      out = spill::stash_stats(arena);
    }
    return to_dict(out);
  });
}

// The options as resolved, keyed by the fields of spill::ArenaOptions, then spill::StashOptions.
PyObject* options_of(PyObject*, PyObject* handle) {
  return guarded([&] {
    const spill::SpillArena& arena = arena_of(handle);
    spill::StashOptions stash;
    {
      Unlocked unlocked;  // the arena's mutex
      stash = spill::stash_options(arena);
    }
    Ref out = to_dict(arena.options());
    if (PyDict_Update(out.get(), to_dict(stash).get()) != 0) throw PythonError();
    return out;
  });
}

// What SpillArena's properties and repr show.
PyObject* describe(PyObject*, PyObject* handle) {
  return guarded([&] {
    const spill::SpillArena& arena = arena_of(handle);
    Ref out = Ref::steal(PyDict_New());
    const auto set = [&out](const char* key, const Ref& value) {
      if (PyDict_SetItemString(out.get(), key, value.get()) != 0) throw PythonError();
    };
    spill::ArenaStats s;
    {
      Unlocked unlocked;  // the arena's mutex
      s = arena.stats();
    }
    set("capacity_bytes", Convert<std::uint64_t>::to_python(s.capacity_bytes));
    set("bytes_in_use", Convert<std::uint64_t>::to_python(s.bytes_in_use));
    set("backing", Convert<spill::Backing>::to_python(arena.backing()));
    set("directory", path_to_python(arena.directory()));
    set("file_system_type", message_to_python(arena.file_system_type()));
    set("opened_without_name", Convert<bool>::to_python(arena.opened_without_name()));
    return out;
  });
}

PyObject* layer_inputs_bytes(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 3, "_bytes_for_layer_inputs");
    PyObject* shape = a[1];
    const auto refuse = [shape] {
      throw_bad_value("bytes_for_layer_inputs: shape", "a (batch, seq, hidden) tuple", shape);
    };
    if (!PySequence_Check(shape) || PyUnicode_Check(shape)) refuse();
    const Py_ssize_t size = PySequence_Size(shape);
    if (size < 0) clear_bad_argument();  // Note [Only a bad argument becomes another error]
    if (size != 3) refuse();
    using U = Convert<std::uint64_t>;
    const auto dim = [&](Py_ssize_t i, const char* field) {
      return U::from_python(Ref::steal(PySequence_GetItem(shape, i)).get(), field);
    };
    spill::ActivationShape parsed;
    parsed.batch = dim(0, "bytes_for_layer_inputs: batch");
    parsed.seq = dim(1, "bytes_for_layer_inputs: seq");
    parsed.hidden = dim(2, "bytes_for_layer_inputs: hidden");
    return U::to_python(spill::bytes_for_layer_inputs(
        U::from_python(a[0], "bytes_for_layer_inputs: layers"), parsed,
        U::from_python(a[2], "bytes_for_layer_inputs: element size")));
  });
}

PyObject* memory_limits(PyObject*, PyObject*) {
  return guarded([] {
    const spill::MemoryLimits m = spill::memory_limits();
    Ref out = to_dict(m);  // the fields, then the two figures made from them
    const auto set = [&out](const char* key, const Ref& value) {
      if (PyDict_SetItemString(out.get(), key, value.get()) != 0) throw PythonError();
    };
    set("usable_bytes", Convert<std::uint64_t>::to_python(m.usable_bytes()));
    set("pressure", Convert<double>::to_python(m.pressure()));
    return out;
  });
}

PyObject* default_directory(PyObject*, PyObject*) {
  return guarded([] { return path_to_python(spill::default_spill_directory()); });
}

PyObject* empty_directory_refusal(PyObject*, PyObject* instead) {
  return guarded(
      [&] { return message_to_python(spill::empty_directory_refusal(utf8(instead, "instead"))); });
}

PyObject* capacity_with_margin(PyObject*, PyObject* args) {
  return guarded([&] {
    const Args a(args, 2, "_capacity_with_margin");
    return Convert<std::uint64_t>::to_python(spill::capacity_with_margin(
        Convert<std::uint64_t>::from_python(a[0], "capacity_with_margin: needed_bytes"),
        Convert<double>::from_python(a[1], "capacity_with_margin: growth_margin")));
  });
}

PyObject* bytes_with_units(PyObject*, PyObject* bytes) {
  return guarded([&] {
    return message_to_python(
        spill::bytes_with_units(Convert<std::uint64_t>::from_python(bytes, "bytes")));
  });
}

}  // namespace

void add_arena() {
  add_function("_arena_new", make_arena, METH_VARARGS,
               "_arena_new(capacity_bytes, directory, options): spillarena.SpillArena's arena.");
  add_function("_arena_stats", stats, METH_O, "A dict keyed by spill::ArenaStats field names.");
  add_function("_arena_stash_stats", stash_stats, METH_O,
               "A dict keyed by spill::StashStats field names: what spillarena.checkpoint did "
               "with this arena's host budget.");
  add_function("_arena_options", options_of, METH_O,
               "The options as resolved, keyed by the field names of spill::ArenaOptions, then "
               "spill::StashOptions.");
  add_function("_arena_describe", describe, METH_O,
               "capacity_bytes, bytes_in_use, backing, directory, file_system_type, "
               "opened_without_name.");
  add_function("default_spill_directory", default_directory, METH_NOARGS,
               "The directory an arena spills to when none is given.");
  add_function("_empty_directory_refusal", empty_directory_refusal, METH_O,
               "The one wording of the refusal of an empty directory string (spill/directory.h).");
  add_function("memory_limits", memory_limits, METH_NOARGS,
               "This process's memory ceiling: its memory cgroup (v1 or v2), MemAvailable, "
               "MemTotal, what it may still take (usable_bytes) and how close it is (pressure, "
               "0 to 1)");
  add_function("_bytes_for_layer_inputs", layer_inputs_bytes, METH_VARARGS,
               "_bytes_for_layer_inputs(layers, (batch, seq, hidden), element_size_bytes)");
  add_function("_capacity_with_margin", capacity_with_margin, METH_VARARGS,
               "_capacity_with_margin(needed_bytes, growth_margin): needed x margin in whole "
               "pages, as a grow aims at it (spill/sizing.h).");
  add_function("_bytes_with_units", bytes_with_units, METH_O,
               "\"16384 bytes (16.00 KiB)\": byte counts as every message gives them "
               "(spill/units.h).");

  add_constant("ARENA_OPTIONS", tuple_of(keyword_names()));
  add_constant("STASH_OPTIONS", tuple_of(field_names<spill::StashOptions>()));
  add_constant("ARENA_STATS", tuple_of(field_names<spill::ArenaStats>()));
  add_constant("STASH_STATS", tuple_of(field_names<spill::StashStats>()));
  add_constant("MAX_CAPACITY_BYTES", Convert<std::uint64_t>::to_python(spill::kMaxCapacityBytes));
  add_constant("MAX_STAGING_BYTES", Convert<std::uint64_t>::to_python(spill::kMaxStagingBytes));
  add_constant("PAGE_SIZE_BYTES", Convert<std::uint64_t>::to_python(spill::page_size_bytes()));
}

Ref tuple_of(const std::vector<std::string>& names) {
  Ref out = Ref::steal(PyTuple_New(static_cast<Py_ssize_t>(names.size())));
  for (std::size_t i = 0; i < names.size(); ++i) {
    // PyTuple_SetItem takes the reference.
    if (PyTuple_SetItem(out.get(), static_cast<Py_ssize_t>(i),
                        message_to_python(names[i]).release()) != 0) {
      throw PythonError();
    }
  }
  return out;
}

}  // namespace spillarena_python
